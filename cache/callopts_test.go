// This file checks the per-call options against the real Redis:
// the TTL a call stores, a forced refresh that still loads once, a call
// that refuses stale values.

package cache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertPTTL checks that key lives at most want, and more than half of it.
func assertPTTL(t *testing.T, rdb *redis.Client, key string, want time.Duration) {
	t.Helper()
	got := rdb.PTTL(t.Context(), key).Val()
	assert.Greater(t, got, want/2, "PTTL(%q)", key)
	assert.LessOrEqual(t, got, want, "PTTL(%q)", key)
}

func TestTTLOptionSetsTheStoredTTL(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(time.Hour), WithoutJitter(), WithEarlyRefresh(0))
	src := &counter{}

	_, err := c.GetOrLoad(t.Context(), p+"one", src.load, TTL(10*time.Second))
	require.NoError(t, err)
	assertPTTL(t, rdb, p+"one", 10*time.Second)

	require.NoError(t, c.Set(t.Context(), p+"set", product{ID: "s"}, TTL(10*time.Second)))
	assertPTTL(t, rdb, p+"set", 10*time.Second)

	keys := []string{p + "m1", p + "m2"}
	_, err = c.GetOrLoadMany(t.Context(), keys, func(_ context.Context, keys []string) (map[string]product, error) {
		m := map[string]product{}
		for _, k := range keys {
			m[k] = product{ID: k}
		}
		return m, nil
	}, TTL(10*time.Second))
	require.NoError(t, err)
	for _, k := range keys {
		assertPTTL(t, rdb, k, 10*time.Second)
	}

	// Without the option: the Cache's TTL.
	require.NoError(t, c.Set(t.Context(), p+"plain", product{ID: "p"}))
	assert.Greater(t, rdb.PTTL(t.Context(), p+"plain").Val(), 59*time.Minute)

	// The loader's SetTTL wins over the call's TTL: it knows the value.
	_, err = c.GetOrLoad(t.Context(), p+"loader", func(ctx context.Context) (product, error) {
		assert.True(t, SetTTL(ctx, 20*time.Second), "SetTTL with the loader's ctx")
		return product{ID: "l"}, nil
	}, TTL(10*time.Second))
	require.NoError(t, err)
	assertPTTL(t, rdb, p+"loader", 20*time.Second)

	// A call the loader makes does not inherit its caller's options.
	_, err = c.GetOrLoad(t.Context(), p+"outer", func(ctx context.Context) (product, error) {
		return c.GetOrLoad(ctx, p+"inner", src.load)
	}, TTL(10*time.Second))
	require.NoError(t, err)
	assertPTTL(t, rdb, p+"outer", 10*time.Second)
	assert.Greater(t, rdb.PTTL(t.Context(), p+"inner").Val(), 59*time.Minute, "the nested call's TTL is the Cache's")
}

func TestSetTTLReportsAContextThatIsNotALoaders(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(time.Hour), WithoutJitter(), WithEarlyRefresh(0))
	outer := t.Context()
	var withOuter, noCacheOuter bool
	_, err := c.GetOrLoad(outer, p+"k", func(ctx context.Context) (product, error) {
		withOuter = SetTTL(outer, 10*time.Second) // the usual slip: the caller's ctx, captured
		noCacheOuter = DoNotCache(outer)
		return product{ID: "k"}, nil
	}, TTL(30*time.Second)) // a call's options are not a loader's either
	require.NoError(t, err)
	assert.False(t, withOuter, "SetTTL with the caller's ctx reports that it did nothing")
	assert.False(t, noCacheOuter, "DoNotCache with the caller's ctx reports that it did nothing")
	assertPTTL(t, rdb, p+"k", 30*time.Second)
	assert.False(t, SetTTL(t.Context(), time.Second))
	assert.False(t, DoNotCache(t.Context()))
}

// TestTTLRunOutIsNotStored: a TTL computed from data may have run out
// (TTL(time.Until(sale.Ends)) once the sale has ended). It must never
// panic: at or below zero the value is returned and not stored, by TTL and
// SetTTL alike; Set removes the older value; under 1ms is 1ms.
func TestTTLRunOutIsNotStored(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(time.Hour), WithoutJitter())
	ended := time.Now().Add(-time.Minute)
	for _, tt := range []struct {
		name string
		call []CallOption
		load func(ctx context.Context) (product, error)
	}{
		{"TTL zero", []CallOption{TTL(0)}, nil},
		{"TTL negative", []CallOption{TTL(time.Until(ended))}, nil},
		{"SetTTL negative", nil, func(ctx context.Context) (product, error) {
			if !SetTTL(ctx, time.Until(ended)) {
				return product{}, errors.New("SetTTL refused a loader's context")
			}
			return product{ID: "v"}, nil
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := p + tt.name
			src := &counter{}
			load := tt.load
			if load == nil {
				load = src.load
			}
			for range 2 {
				v, err := c.GetOrLoad(t.Context(), key, load, tt.call...)
				require.NoError(t, err)
				assert.NotEmpty(t, v.ID, "the loaded value is returned")
			}
			assert.Zero(t, rdb.Exists(t.Context(), key, LockKey(key)).Val(), "GetOrLoad(%q) stored a value whose TTL ran out", key)
			got, err := c.GetOrLoadMany(t.Context(), []string{key}, func(ctx context.Context, keys []string) (map[string]product, error) {
				return map[string]product{keys[0]: {ID: "m"}}, nil
			}, tt.call...)
			require.NoError(t, err)
			assert.Len(t, got, 1)
		})
	}
	require.NoError(t, c.Set(t.Context(), p+"old", product{ID: "old"}))
	require.NoError(t, c.Set(t.Context(), p+"old", product{ID: "new"}, TTL(time.Until(ended))))
	_, err := c.Get(t.Context(), p+"old")
	assert.ErrorIs(t, err, ErrCacheMiss, "Set with a TTL run out leaves no older value")
	require.NoError(t, c.Set(t.Context(), p+"tiny", product{ID: "t"}, TTL(time.Microsecond)))
	assert.LessOrEqual(t, rdb.PTTL(t.Context(), p+"tiny").Val(), time.Millisecond, "under 1ms is Redis's 1ms")
}

func TestForceRefreshLoadsOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	other := redistest.Client(t, redistest.Addr(t)) // a second process's client
	caches := []*Cache[product]{New[product](rdb, WithTTL(time.Hour)), New[product](other, WithTTL(time.Hour))}
	key := p + "k"
	src := &counter{}
	first, err := caches[0].GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)

	// A plain call is a hit.
	_, err = caches[1].GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)
	require.Equal(t, int64(1), src.calls.Load())

	// 10 forced callers in each of 2 caches, at once: one load more.
	slow := &counter{delay: 200 * time.Millisecond}
	slow.calls.Store(src.calls.Load())
	const callers = 10
	vals := make([]product, 2*callers)
	errs := make([]error, 2*callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range vals {
		wg.Go(func() {
			<-start
			vals[i], errs[i] = caches[i%2].GetOrLoad(t.Context(), key, slow.load, ForceRefresh())
		})
	}
	close(start)
	wg.Wait()
	assert.Equal(t, int64(2), slow.calls.Load(), "loads after 20 forced callers in 2 caches; want one more")
	for i := range vals {
		require.NoError(t, errs[i])
		assert.NotEqual(t, first.Price, vals[i].Price, "caller %d got the value that was cached before it", i)
		assert.Equal(t, 2, vals[i].Price, "caller %d", i)
	}

	// The forced value was stored: a plain call is a hit on it.
	got, err := caches[1].GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)
	assert.Equal(t, 2, got.Price)
	assert.Equal(t, int64(2), slow.calls.Load())
}

func TestNoStaleRefusesAValuePastItsTTL(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithStale(time.Minute), WithSoftLoadTimeout(0))
	key := p + "k"
	require.NoError(t, c.Set(t.Context(), key, product{ID: "old"}, TTL(20*time.Millisecond)))
	time.Sleep(50 * time.Millisecond) // past its TTL, well within the stale window

	got, err := c.Get(t.Context(), key)
	require.NoError(t, err)
	assert.Equal(t, "old", got.ID, "Get serves the stale value")
	_, err = c.Get(t.Context(), key, NoStale())
	assert.ErrorIs(t, err, ErrCacheMiss, "Get with NoStale")

	src := &counter{}
	got, err = c.GetOrLoad(t.Context(), key, src.load, NoStale())
	require.NoError(t, err)
	assert.Equal(t, "p1", got.ID, "GetOrLoad with NoStale loads")
	assert.Equal(t, int64(1), src.calls.Load())
	got, err = c.Get(t.Context(), key, NoStale())
	require.NoError(t, err)
	assert.Equal(t, "p1", got.ID, "the loaded value is stored")
}
