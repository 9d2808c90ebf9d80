// This file proves Get (a read that never loads) and Set (a write that
// wins over any load in flight).

package cache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	// Not parallel: a read within 50 ms of the load must find the value fresh.
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0), WithStale(time.Minute))

	_, err := c.Get(t.Context(), p+"k")
	assert.ErrorIs(t, err, ErrCacheMiss)

	_, err = c.GetOrLoad(t.Context(), p+"k", (&counter{}).load)
	require.NoError(t, err)
	var info ResultInfo
	v, err := c.Get(WithResultInfo(t.Context(), &info), p+"k")
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID)
	assert.False(t, info.Stale)

	time.Sleep(100 * time.Millisecond)
	v, err = c.Get(WithResultInfo(t.Context(), &info), p+"k")
	require.NoError(t, err, "a stale value is still returned")
	assert.Equal(t, "p1", v.ID)
	assert.True(t, info.Stale)

	_, err = c.GetOrLoad(t.Context(), p+"absent", func(context.Context) (product, error) { return product{}, ErrNotFound })
	require.ErrorIs(t, err, ErrNotFound)
	_, err = c.Get(t.Context(), p+"absent")
	assert.ErrorIs(t, err, ErrNotFound, "a cached not-found is not a miss")
	assert.NotErrorIs(t, err, ErrCacheMiss)

	require.NoError(t, rdb.Set(t.Context(), p+"junk", "not a record", time.Minute).Err())
	_, err = c.Get(t.Context(), p+"junk")
	assert.ErrorIs(t, err, ErrCacheMiss, "an unreadable value is a miss")
	_, err = c.Get(t.Context(), "")
	assert.ErrorIs(t, err, ErrEmptyKey)
}

// TestSetWinsOverALoadInFlight: instance A is loading v1 when instance B
// writes v2 through; A's commit must not overwrite v2, and callers that
// begin after Set returned get v2.
func TestSetWinsOverALoadInFlight(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "k"
	addr := redistest.Addr(t)
	rdbA := redistest.Client(t, addr)
	a, b := New[string](rdbA), New[string](redistest.Client(t, addr))
	loading, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) {
			close(loading)
			<-release
			return "v1", nil
		})
	})
	<-loading
	require.NoError(t, b.Set(t.Context(), key, "v2"))
	var later string
	wg.Go(func() {
		later, _ = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v3", nil })
	})
	time.Sleep(50 * time.Millisecond) // let later join A's flight
	close(release)
	wg.Wait()
	assert.Equal(t, "v2", later, "a caller that began after Set returned must get the value set")
	v, err := b.Get(t.Context(), key)
	require.NoError(t, err)
	assert.Equal(t, "v2", v, "the older load must not overwrite the value set")
	assert.Zero(t, rdbA.Exists(t.Context(), LockKey(key)).Val())
}

type failingCodec struct{}

func (failingCodec) Marshal(any) ([]byte, error) { return nil, errors.New("cannot encode") }
func (failingCodec) Unmarshal([]byte, any) error { return errors.New("cannot decode") }

func TestSetBadInput(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	err := New[product](rdb, WithCodec(failingCodec{})).Set(t.Context(), p+"k", product{})
	assert.ErrorContains(t, err, "cannot encode")
	assert.Zero(t, rdb.Exists(t.Context(), p+"k").Val(), "nothing is written")
	assert.ErrorIs(t, New[product](rdb).Set(t.Context(), "", product{}), ErrEmptyKey)
	assert.ErrorIs(t, New[product](rdb).Set(t.Context(), LockKey("x"), product{}), ErrReservedKey)
}

func TestLoaderDecidesTTL(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(time.Hour), WithoutJitter(), WithEarlyRefresh(0))
	_, err := c.GetOrLoad(t.Context(), p+"short", func(ctx context.Context) (product, error) {
		SetTTL(ctx, 10*time.Second)
		return product{ID: "s"}, nil
	})
	require.NoError(t, err)
	ttl := rdb.PTTL(t.Context(), p+"short").Val()
	assert.Greater(t, ttl, 5*time.Second)
	assert.LessOrEqual(t, ttl, 10*time.Second)

	src := &counter{}
	uncached := func(ctx context.Context) (product, error) {
		DoNotCache(ctx)
		return src.load(ctx)
	}
	for range 3 {
		_, err := c.GetOrLoad(t.Context(), p+"volatile", uncached)
		require.NoError(t, err)
	}
	assert.Equal(t, int64(3), src.calls.Load(), "a value the loader keeps out of the cache is loaded each time")
	assert.Zero(t, rdb.Exists(t.Context(), p+"volatile", LockKey(p+"volatile")).Val())

	SetTTL(t.Context(), time.Second) // outside a loader: nothing happens
	DoNotCache(t.Context())
}
