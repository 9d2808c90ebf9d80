// This file checks that invalid options fail loudly at New, naming the
// option.

package cache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewPanicsOnInvalidOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"}) // never dialled
	t.Cleanup(func() { rdb.Close() })
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithTTL(0), "WithTTL(0s)"},
		{WithTTL(-time.Second), "WithTTL(-1s)"},
		{WithTTL(time.Microsecond), "millisecond resolution"},
		{WithNotFoundTTL(-time.Second), "WithNotFoundTTL(-1s)"},
		{WithNotFoundTTL(time.Microsecond), "millisecond resolution"},
		{WithLockTTL(0), "WithLockTTL(0s)"},
		{WithLockTTL(time.Millisecond), "at least 3ms"},
		{WithRetry(-1, time.Millisecond), "maxRetries must not be negative"},
		{WithRetry(3, 0), "backoff must be positive"},
		{WithJitter(-0.1), "WithJitter(-0.1)"},
		{WithJitter(1), "WithJitter(1)"},
		{WithLoadTimeout(0), "WithLoadTimeout(0s)"},
		{WithCodec(nil), "WithCodec(nil)"},
		{WithFailurePolicy(7), "unknown policy"},
		{WithCircuitBreaker(-1, time.Second), "WithCircuitBreaker(-1, 1s)"},
		{WithCircuitBreaker(3, 0), "WithCircuitBreaker(3, 0s)"},
		{func(cfg *config) { WithPrefix("a{}b:")(cfg); WithTags()(cfg) }, `WithTags with WithPrefix("a{}b:")`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			defer func() {
				r := recover()
				err, ok := r.(error)
				if !ok {
					t.Fatalf("New with %s did not panic with an error (got %v)", tc.want, r)
				}
				assert.Contains(t, err.Error(), tc.want)
			}()
			New[int](rdb, tc.opt)
		})
	}
	assert.PanicsWithValue(t, "cache: New: nil Redis client", func() { New[int](nil) })
	assert.NotPanics(t, func() { New[int](rdb, WithRetry(0, 0), WithNotFoundTTL(0), WithoutJitter()) })
}

// TestDefaultWaiterBudgetCoversTheLoadTimeout: the default budget (60 x
// 100ms = 6s) used to be shorter than the load timeout (30s), so a waiter
// gave up while the holder was still legitimately loading.
func TestDefaultWaiterBudgetCoversTheLoadTimeout(t *testing.T) {
	for _, lt := range []time.Duration{DefaultLoadTimeout, 2 * time.Second, 150 * time.Millisecond, time.Hour} {
		cfg := newConfig([]Option{WithLoadTimeout(lt)})
		if got := time.Duration(cfg.retry.max) * cfg.retry.backoff; got < lt {
			t.Errorf("WithLoadTimeout(%v): waiters give up after %v; want at least the load timeout", lt, got)
		}
	}
	cfg := newConfig([]Option{WithRetry(3, time.Millisecond), WithLoadTimeout(time.Hour)})
	assert.Equal(t, retryPolicy{max: 3, backoff: time.Millisecond}, cfg.retry, "an explicit WithRetry is kept as given")
}

// This file checks the per-call options against the real Redis:
// the TTL a call stores, a forced refresh that still loads once, a call
// that refuses stale values.
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

// This file tests options that used to apply halfway: a per-call TTL through refreshes, and replica reads with the near
// cache.
// refreshes returns an observer that counts refreshes that stored a value,
// and their count.
func refreshes() (Option, *atomic.Int64) {
	n := &atomic.Int64{}
	return WithObserver(func(e Event) {
		if e.Kind == EventRefresh && e.Err == nil {
			n.Add(1)
		}
	}), n
}

// storedTTL returns the TTL written in key's record and how long Redis keeps
// the key.
func storedTTL(t *testing.T, rdb *redis.Client, key string) (own, pttl time.Duration) {
	t.Helper()
	b, err := rdb.Get(t.Context(), key).Bytes()
	require.NoError(t, err)
	f, ok := record.ReadFreshness(b)
	require.True(t, ok, "a record without freshness")
	pttl, err = rdb.PTTL(t.Context(), key).Result()
	require.NoError(t, err)
	return f.TTL, pttl
}

// TestRefreshKeepsTheValuesTTL: a value stored with TTL(d), SetTTL or
// Set's TTL was stored for the Cache's TTL (an hour here) by its refresh
// when the call that started it chose none; a refresh now keeps the
// value's TTL, for a stale refresh, an early one and a batch's, and after
// a failed refresh's throttle. A TTL the refreshing call chooses still wins.
func TestRefreshKeepsTheValuesTTL(t *testing.T) {
	const short = 300 * time.Millisecond
	base := []Option{WithTTL(time.Hour), WithoutJitter(), WithoutNearCache()}
	plain := func(context.Context) (product, error) { return product{ID: "plain"}, nil }
	kept := func(t *testing.T, rdb *redis.Client, key string, want time.Duration) {
		t.Helper()
		own, pttl := storedTTL(t, rdb, key)
		assert.Equal(t, want, own, "the TTL in %s's record", key)
		assert.Less(t, pttl, want+time.Minute+time.Second, "how long Redis keeps %s", key)
	}

	t.Run("stale", func(t *testing.T) {
		rdb, p := setup(t)
		obs, n := refreshes()
		c := New[product](rdb, append(base, WithStale(time.Minute), obs)...)
		defer c.Close()
		_, err := c.GetOrLoad(t.Context(), p+"k", plain, TTL(short))
		require.NoError(t, err)
		kept(t, rdb, p+"k", short)
		time.Sleep(short + 50*time.Millisecond) // stale
		_, err = c.GetOrLoad(t.Context(), p+"k", plain)
		require.NoError(t, err)
		waitFor(t, func() bool { return n.Load() == 1 })
		kept(t, rdb, p+"k", short)

		time.Sleep(short + 50*time.Millisecond) // stale again: a TTL the call chooses wins
		_, err = c.GetOrLoad(t.Context(), p+"k", plain, TTL(2*short))
		require.NoError(t, err)
		waitFor(t, func() bool { return n.Load() == 2 })
		kept(t, rdb, p+"k", 2*short)
	})

	t.Run("early, SetTTL", func(t *testing.T) {
		rdb, p := setup(t)
		obs, n := refreshes()
		c := New[product](rdb, append(base, WithEarlyRefresh(1), obs)...)
		defer c.Close()
		_, err := c.GetOrLoad(t.Context(), p+"k", func(ctx context.Context) (product, error) {
			time.Sleep(50 * time.Millisecond) // a load time, for the refresh to come before the TTL ends
			SetTTL(ctx, short)
			return product{ID: "own"}, nil
		})
		require.NoError(t, err)
		waitFor(t, func() bool {
			_, err := c.GetOrLoad(t.Context(), p+"k", plain)
			return err == nil && n.Load() == 1
		})
		kept(t, rdb, p+"k", short)
	})

	t.Run("batch, Set", func(t *testing.T) {
		rdb, p := setup(t)
		obs, n := refreshes()
		c := New[product](rdb, append(base, WithStale(time.Minute), obs)...)
		defer c.Close()
		require.NoError(t, c.Set(t.Context(), p+"a", product{ID: "a"}, TTL(short)))
		require.NoError(t, c.Set(t.Context(), p+"b", product{ID: "b"}, TTL(short+100*time.Millisecond)))
		time.Sleep(short + 150*time.Millisecond) // both stale
		_, err := c.GetOrLoadMany(t.Context(), []string{p + "a", p + "b"}, func(_ context.Context, keys []string) (map[string]product, error) {
			m := map[string]product{}
			for _, k := range keys {
				m[k] = product{ID: k}
			}
			return m, nil
		})
		require.NoError(t, err)
		waitFor(t, func() bool { return n.Load() == 2 })
		kept(t, rdb, p+"a", short)
		kept(t, rdb, p+"b", short+100*time.Millisecond)
	})

	t.Run("after a failed refresh", func(t *testing.T) {
		rdb, p := setup(t)
		obs, n := refreshes()
		c := New[product](rdb, append(base, WithStale(time.Minute), WithStaleThrottle(100*time.Millisecond), obs)...)
		defer c.Close()
		_, err := c.GetOrLoad(t.Context(), p+"k", plain, TTL(short))
		require.NoError(t, err)
		time.Sleep(short + 50*time.Millisecond)
		var failed atomic.Int64
		_, err = c.GetOrLoad(t.Context(), p+"k", func(context.Context) (product, error) {
			failed.Add(1)
			return product{}, errors.New("database down")
		})
		require.NoError(t, err, "the stale value")
		waitFor(t, func() bool { return failed.Load() == 1 })
		waitFor(t, func() bool {
			_, err := c.GetOrLoad(t.Context(), p+"k", plain)
			return err == nil && n.Load() == 1
		})
		kept(t, rdb, p+"k", short)
	})
}

// TestReplicaReadsOnAClusterRunNoNearCache: with WithReplicaReads on a
// cluster a near cache can keep nothing (a replica's copy may be older than
// the invalidations), yet it used to hold a lease that every writer of the
// prefix waited for, and a tracking connection per master. The Cache now
// runs as one made WithoutNearCache: no lease, and its writes still
// confirmed with the others' near caches.
func TestReplicaReadsOnAClusterRunNoNearCache(t *testing.T) {
	rdb, p := setup(t)
	addr := rdb.Options().Addr
	cluster := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:         []string{addr},
		RouteRandomly: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { // the test Redis serves every slot
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		},
	})
	t.Cleanup(func() { cluster.Close() })
	c := New[product](cluster, WithPrefix(p), WithReplicaReads())
	defer c.Close()

	src := &counter{}
	for range 5 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "p2"}))
	assert.True(t, c.near == nil, "a near cache that can keep nothing")
	assert.NotNil(t, c.writeTracker(), "its writes are not confirmed with the others' near caches")
	holders, err := rdb.HKeys(t.Context(), coherence.RegistryKey(p)).Result()
	require.NoError(t, err)
	for _, h := range holders {
		assert.Equal(t, "~since", h, "a lease in the registry, which writers wait for")
	}
	assert.Zero(t, c.Stats().NearHits)
}
