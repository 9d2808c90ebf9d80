// This file tests options that used to apply halfway: a per-call TTL through refreshes, and replica reads with the near
// cache.

package cache

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
