// This file Expire makes the next read load anew, in any process;
// under WithStale the old value is the fallback of a failed load.

package cache

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/record"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpire(t *testing.T) {
	t.Parallel()
	for _, stale := range []bool{false, true} {
		name := map[bool]string{false: "without stale", true: "with stale"}[stale]
		t.Run(name, func(t *testing.T) {
			_, p := setup(t)
			opts := []Option{WithTTL(time.Hour)}
			if stale {
				opts = append(opts, WithStale(time.Hour))
			}
			reader, _, _ := newNearCache(t, p, opts...) // another process, with the value in memory
			writer, _, _ := newNearCache(t, p, opts...)
			var version atomic.Int64
			load := func(context.Context) (product, error) {
				return product{ID: "v", Price: int(version.Add(1))}, nil
			}
			for range 3 {
				v, err := reader.GetOrLoad(t.Context(), "k", load)
				require.NoError(t, err)
				require.Equal(t, 1, v.Price)
			}
			require.NoError(t, writer.Expire(t.Context(), "k"))
			var info ResultInfo
			v, err := reader.GetOrLoad(WithResultInfo(t.Context(), &info), "k", load)
			require.NoError(t, err)
			assert.Equal(t, 2, v.Price, "the read after Expire returned must load anew")
			assert.False(t, info.Stale)

			require.NoError(t, writer.Expire(t.Context(), "k"))
			boom := errors.New("database down")
			info = ResultInfo{}
			v, err = reader.GetOrLoad(WithResultInfo(t.Context(), &info), "k", func(context.Context) (product, error) { return product{}, boom })
			if !stale {
				assert.ErrorIs(t, err, boom, "without WithStale nothing is left to fall back on")
				return
			}
			require.NoError(t, err, "under WithStale the old value is the fallback")
			assert.Equal(t, 2, v.Price)
			assert.True(t, info.Stale, "the fallback is marked stale")
		})
	}
	t.Run("absent key and bad keys", func(t *testing.T) {
		_, p := setup(t)
		c, _, _ := newNearCache(t, p, WithStale(time.Minute))
		assert.NoError(t, c.Expire(t.Context(), "absent"))
		assert.ErrorIs(t, c.Expire(t.Context(), ""), ErrEmptyKey)
	})
}

// TestExpireWaitsForAnotherProcesssReload: after Expire, a reader in a
// second process while the first reloads waits for that reload instead of
// getting the old value; foreign bytes at the key do not panic.
func TestExpireWaitsForAnotherProcesssReload(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	a, _, _ := newNearCache(t, p, WithStale(time.Hour))
	b, _, _ := newNearCache(t, p, WithStale(time.Hour))
	first := func(context.Context) (product, error) { return product{ID: "v", Price: 1}, nil }
	_, err := a.GetOrLoad(t.Context(), "k", first)
	require.NoError(t, err)
	require.NoError(t, b.Expire(t.Context(), "k"))

	loading := make(chan struct{})
	done := make(chan product, 1)
	go func() {
		v, _ := a.GetOrLoad(context.Background(), "k", func(context.Context) (product, error) {
			close(loading)
			time.Sleep(300 * time.Millisecond)
			return product{ID: "v", Price: 2}, nil
		})
		done <- v
	}()
	<-loading
	var info ResultInfo
	v, err := b.GetOrLoad(WithResultInfo(t.Context(), &info), "k", first)
	require.NoError(t, err)
	assert.Equal(t, 2, v.Price, "a reader while another process reloads must wait for the reload")
	assert.False(t, info.Stale)
	assert.Equal(t, 2, (<-done).Price)

	for _, foreign := range []string{"", "x", "\x01\x10\x0c"} {
		require.NoError(t, rdb.Set(t.Context(), p+"foreign", foreign, 0).Err())
		assert.NotPanics(t, func() { assert.NoError(t, b.Expire(t.Context(), "foreign")) })
		assert.Zero(t, rdb.Exists(t.Context(), p+"foreign").Val(), "unreadable bytes: Expire deletes them")
	}
}

// The reload after Expire keeps the TTL the value was stored with, as a
// refresh does.
func TestExpireKeepsTheValuesTTL(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p), WithStale(time.Minute), WithoutNearCache())
	defer c.Close()
	require.NoError(t, c.Set(ctx, "k", product{ID: "k"}, TTL(time.Minute)))
	require.NoError(t, c.Expire(ctx, "k"))
	_, err := c.GetOrLoad(ctx, "k", func(context.Context) (product, error) { return product{ID: "k", Price: 2}, nil })
	require.NoError(t, err)
	b, err := rdb.Get(ctx, p+"k").Bytes()
	require.NoError(t, err)
	f, ok := record.ReadFreshness(b)
	require.True(t, ok)
	assert.Equal(t, time.Minute, f.TTL, "the reload lost the value's TTL")
}
