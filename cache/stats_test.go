// This file Stats counts what the Cache did, and SkipNear reads past
// memory.

package cache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatsAndSkipNear(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, _ := newNearCache(t, p)
	src := &counter{}
	for range 10 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	c.near.store.CleanUp() // otter applies writes to its weights in batches
	s := c.Stats()
	assert.Equal(t, int64(1), s.Loads, "Loads")
	assert.Equal(t, int64(1), s.Misses, "Misses")
	assert.Positive(t, s.NearHits, "NearHits")
	assert.Equal(t, int64(10), s.NearHits+s.RedisHits+s.Misses, "every read is a near hit, a Redis hit or a miss")
	assert.Equal(t, int64(1), s.NearEntries, "NearEntries")
	assert.Positive(t, s.NearBytes, "NearBytes")
	assert.False(t, s.BreakerOpen)

	// SkipNear: the value is in memory, yet the call reads Redis.
	_, err := c.GetOrLoad(t.Context(), "k", src.load, SkipNear())
	require.NoError(t, err)
	_, err = c.Get(t.Context(), "k", SkipNear())
	require.NoError(t, err)
	after := c.Stats()
	assert.Equal(t, s.NearHits, after.NearHits, "SkipNear served from memory")
	assert.Equal(t, s.RedisHits+2, after.RedisHits, "GetOrLoad and Get with SkipNear read Redis")

	// Get counts as GetOrLoad's reads do: a miss when Redis has nothing.
	_, err = c.Get(t.Context(), "nothing")
	require.ErrorIs(t, err, ErrCacheMiss)
	assert.Equal(t, after.Misses+1, c.Stats().Misses, "a Get that found nothing")

	// A failed load counts as one; a not-found does not.
	boom := errors.New("boom")
	_, err = c.GetOrLoad(t.Context(), "bad", func(context.Context) (product, error) { return product{}, boom })
	require.ErrorIs(t, err, boom)
	_, err = c.GetOrLoad(t.Context(), "absent", func(context.Context) (product, error) { return product{}, ErrNotFound })
	require.ErrorIs(t, err, ErrNotFound)
	final := c.Stats()
	assert.Equal(t, after.Loads+2, final.Loads)
	assert.Equal(t, after.LoadErrors+1, final.LoadErrors)
}

// BenchmarkStatsCount is what Stats adds to a near hit: one striped atomic
// add, from every core at once.
func BenchmarkStatsCount(b *testing.B) {
	var s counters
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.count(EventNearHit, nil)
		}
	})
}

func BenchmarkStatsCountSerial(b *testing.B) {
	var s counters
	for b.Loop() {
		s.count(EventNearHit, nil)
	}
}

// Under FailOpen, the loads of keys Redis could not serve are counted, so a
// dashboard sees the database taking the cache's load.
func TestStatsCountUncachedLoads(t *testing.T) {
	t.Parallel()
	rdb, _ := dialCounter(t, deadAddr(t))
	c := New[product](rdb, WithoutNearCache(), WithErrorHook(func(string, error) {}))
	defer c.Close()
	for range 3 {
		_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
		require.NoError(t, err)
	}
	assert.Equal(t, int64(3), c.Stats().UncachedLoads)
}

// TestErrorHooksChain: every hook given hears every absorbed error, in the
// order given, as observers do.
func TestErrorHooksChain(t *testing.T) {
	t.Parallel()
	rdb, _ := dialCounter(t, deadAddr(t))
	var order []int
	var first, second atomic.Int64
	c := New[product](rdb, WithoutNearCache(), WithCircuitBreaker(0, time.Second),
		WithErrorHook(func(string, error) { first.Add(1); order = append(order, 1) }),
		WithErrorHook(nil), // ignored, as WithObserver(nil)
		WithErrorHook(func(string, error) { second.Add(1); order = append(order, 2) }))
	defer c.Close()
	_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load) // FailOpen: the outage goes to the hooks
	require.NoError(t, err)
	assert.Positive(t, first.Load())
	assert.Equal(t, first.Load(), second.Load(), "each hook hears each error")
	assert.Equal(t, []int{1, 2}, order[:2])
}

// TestStatsCountDecodeErrors: a record another value type wrote is counted
// in Stats, each read that met it.
func TestStatsCountDecodeErrors(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	words := New[string](rdb, WithoutNearCache())
	defer words.Close()
	require.NoError(t, words.Set(t.Context(), key, "not a product"))
	products := New[product](rdb, WithoutNearCache())
	defer products.Close()
	_, err := products.Get(t.Context(), key)
	require.ErrorIs(t, err, ErrCacheMiss)
	assert.Equal(t, int64(1), products.Stats().DecodeErrors)
	assert.Zero(t, words.Stats().DecodeErrors)
}

// Every write is counted and timed, its confirmation included, so a
// dashboard sees what writes cost: one EventWrite per Set, Delete, Expire.
func TestStatsCountWrites(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	var took []time.Duration
	var mu sync.Mutex
	c, _, _ := newNearCache(t, p, WithStale(time.Minute), WithObserver(func(e Event) {
		if e.Kind == EventWrite {
			mu.Lock()
			took = append(took, e.Duration)
			mu.Unlock()
		}
	}))
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "k"}))
	require.NoError(t, c.Expire(t.Context(), "k"))
	require.NoError(t, c.Delete(t.Context(), "k"))
	assert.Equal(t, int64(3), c.Stats().Writes)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, took, 3)
	for i, d := range took {
		assert.Positive(t, d, "write %d has no duration", i)
	}
}
