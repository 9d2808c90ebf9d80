// This file tests the writes: Expire makes the next read load anew, in any
// process (under WithStale the old value is the fallback of a failed
// load), and every write's script runs by its hash.

package cache

import (
	"context"
	"errors"
	"fmt"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestScriptsRunByHash: once Redis has the scripts, a Set, a Delete, a
// DeleteByTag, an Expire and a GetOrLoadMany send no EVAL (every script by
// its SHA, in the confirmation's pipeline too), with the near cache on.
func TestScriptsRunByHash(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	wire := redistest.CountCommands(rdb)
	c := New[product](rdb, WithPrefix(p), WithTags(), WithStale(time.Minute))
	defer c.Close()
	ctx := t.Context()
	keys := []string{"a", "b", "c", "d"}
	src := &source{}
	run := func() {
		require.NoError(t, c.Set(ctx, "k", product{ID: "1"}, Tags("t")))
		require.NoError(t, c.Expire(ctx, "k"))
		require.NoError(t, c.Delete(ctx, "k"))
		require.NoError(t, c.DeleteByTag(ctx, "t"))
		_, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
		require.NoError(t, err)
		require.NoError(t, c.Delete(ctx, keys...))
	}
	run() // the scripts are in Redis after this
	wire.Take()
	require.NoError(t, c.Set(ctx, "k", product{ID: "1"}, Tags("t")))
	n, setBytes := wire.Take()
	assert.Zero(t, n["eval"], "Set: %v", n)
	t.Logf("one Set sent %d argument bytes: %v", setBytes, n)
	_, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
	require.NoError(t, err)
	n, manyBytes := wire.Take()
	assert.Zero(t, n["eval"], "GetOrLoadMany: %v", n)
	t.Logf("one GetOrLoadMany of %d misses sent %d argument bytes: %v", len(keys), manyBytes, n)
	require.NoError(t, c.Delete(ctx, keys...))
	run()
	n, _ = wire.Take()
	assert.Zero(t, n["eval"], "%v", n)
	assert.Less(t, setBytes, 1500, "a Set sends the value and the keys, not the scripts")
}

// TestScriptFlushBetweenCalls: a SCRIPT FLUSH between calls costs the next
// of each kind one NOSCRIPT and a reload, never a failure.
func TestScriptFlushBetweenCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it empties the server's script cache")
	rdb := redistest.Client(t, srv.Addr)
	wire := redistest.CountCommands(rdb)
	c := New[product](rdb, WithTags(), WithStale(time.Minute))
	defer c.Close()
	ctx := t.Context()
	keys := []string{"a", "b", "c"}
	src := &source{}
	load := &counter{}
	for round := range 3 {
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		v := product{ID: fmt.Sprint(round)}
		require.NoError(t, c.Set(ctx, "k", v, Tags("t")))
		got, err := c.GetOrLoad(ctx, "k", load.load)
		require.NoError(t, err)
		assert.Equal(t, v, got, "round %d", round)
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		require.NoError(t, c.Expire(ctx, "k"))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		require.NoError(t, c.DeleteByTag(ctx, "t"))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		many, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
		require.NoError(t, err)
		assert.Len(t, many, len(keys))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		require.NoError(t, c.Delete(ctx, keys...))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		_, err = c.GetOrLoad(ctx, "k", load.load) // removed by the tag: loaded
		require.NoError(t, err)
	}
	n, _ := wire.Take()
	assert.Positive(t, n["evalsha"])
	t.Logf("commands: %v", n)
}

// A Delete in another instance is seen by
// every caller that begins after it returns, even one that joins a flight
// begun before it.

// TestCallerAfterDeleteElsewhereDoesNotGetTheLoadInFlight: instance A is
// loading v1 when instance B deletes the key; a caller that starts on A
// after the Delete returned used to join A's flight and get v1.
func TestCallerAfterDeleteElsewhereDoesNotGetTheLoadInFlight(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "item"
	addr := redistest.Addr(t)
	a := New[string](redistest.Client(t, addr))
	b := New[string](redistest.Client(t, addr))

	loading, release := make(chan struct{}), make(chan struct{})
	var first struct {
		v   string
		err error
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		first.v, first.err = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) {
			close(loading)
			<-release
			return "v1", nil // read from the source before it changed
		})
	})
	<-loading
	require.NoError(t, b.Delete(t.Context(), key))

	var later struct {
		v   string
		err error
	}
	wg.Go(func() {
		later.v, later.err = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	time.Sleep(100 * time.Millisecond) // let later join the flight (if it does not, the test proves less, never fails wrongly)
	close(release)
	wg.Wait()

	require.NoError(t, first.err)
	assert.Equal(t, "v1", first.v, "a caller that began before the Delete may get the load it joined")
	require.NoError(t, later.err)
	assert.Equal(t, "v2", later.v, "a caller that began after the Delete returned got the load the Delete voided")
	got, err := a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v3", nil })
	require.NoError(t, err)
	assert.Equal(t, "v2", got, "the voided load must not have been stored")
}

// TestCallerAfterDeleteElsewhereDoesNotGetAReadInFlight: A's GET ran before
// B's Delete but its reply arrives after; a caller that joins A's flight
// after the Delete returned must not get the deleted value.
func TestCallerAfterDeleteElsewhereDoesNotGetAReadInFlight(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "item"
	addr := redistest.Addr(t)
	rdbA := redistest.Client(t, addr)
	// Without near caches: the test holds a read of the Redis path, and it
	// adds a hook to a client in use (a race on go-redis v9.5.5).
	a := New[string](rdbA, WithoutNearCache())
	b := New[string](redistest.Client(t, addr), WithoutNearCache())
	_, err := b.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v0", nil })
	require.NoError(t, err)

	gate := redistest.NewReadGate()
	rdbA.AddHook(gate)
	var wg sync.WaitGroup
	var firstV, laterV string
	var firstErr, laterErr error
	wg.Go(func() { firstV, firstErr = a.GetOrLoad(t.Context(), key, failLoad) })
	gate.Next(t) // GET has run on the server and returned v0
	require.NoError(t, b.Delete(t.Context(), key))
	wg.Go(func() {
		laterV, laterErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	time.Sleep(100 * time.Millisecond) // let later join the flight
	gate.Open()
	wg.Wait()

	require.NoError(t, firstErr)
	assert.Equal(t, "v0", firstV)
	require.NoError(t, laterErr)
	assert.Equal(t, "v2", laterV, "a caller that began after the Delete returned got the deleted value")
}

func failLoad(context.Context) (string, error) {
	panic("the loader must not run")
}
