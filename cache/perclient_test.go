// This file proves that the near caches on one Redis client share
// their tracking connections: one per master, for every
// prefix, whose loss drops the memory of every prefix.

package cache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// subscribedConns counts the server's connections in pub/sub mode (flags
// P), and among them the near caches' tracking connections.
func subscribedConns(t *testing.T, admin *redis.Client) (all, tracking int) {
	t.Helper()
	list, err := admin.ClientList(t.Context()).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "flags=") && strings.Contains(f, "P") {
				all++
				if strings.Contains(line, " name=stampede-near ") {
					tracking++
				}
			}
		}
	}
	return all, tracking
}

// tenNearCaches opens ten near caches with ten prefixes on rdb, each of
// which has waited once on a lock held elsewhere if admin is not nil (so
// that the client's notifier is subscribed too), and waits until all serve
// memory.
func tenNearCaches(t *testing.T, rdb redis.UniversalClient, admin *redis.Client) []*Cache[product] {
	t.Helper()
	caches := make([]*Cache[product], 10)
	for i := range caches {
		p := fmt.Sprintf("pc%d:", i)
		c := New[product](rdb, WithPrefix(p), WithNearCache(1<<20), WithRetry(1, 20*time.Millisecond))
		t.Cleanup(func() { c.Close() })
		caches[i] = c
		if admin == nil {
			continue
		}
		require.NoError(t, admin.Set(t.Context(), LockKey(p+"held"), "someone else", 10*time.Second).Err())
		_, err := c.GetOrLoad(t.Context(), "held", (&counter{}).load)
		require.ErrorIs(t, err, ErrLockNotAcquired)
	}
	for i, c := range caches {
		require.True(t, eventually(func() bool { return nearReady(c) }), "cache %d never served memory", i)
	}
	return caches
}

// TestTenCachesHoldTwoSubscribedConnections: ten near caches with ten
// prefixes on one client held eleven subscribed connections (one tracking
// connection each, and the notifier's); they hold two, one of them the
// tracking connection that all ten share.
func TestTenCachesHoldTwoSubscribedConnections(t *testing.T) {
	srv := redistest.PrivateServer(t, "it counts the server's pub/sub connections")
	admin := redistest.Client(t, srv.Addr)
	caches := tenNearCaches(t, redistest.Client(t, srv.Addr), admin)
	all, tracking := subscribedConns(t, admin)
	t.Logf("10 caches on one client: %d subscribed connections, %d of them tracking", all, tracking)
	assert.LessOrEqual(t, all, 2, "subscribed connections of 10 caches on one client")
	assert.Equal(t, 1, tracking, "tracking connections of 10 caches on one client")
	id := trackingClientID(t, caches[0])
	for _, c := range caches[1:] {
		assert.Equal(t, id, trackingClientID(t, c), "a cache with a tracking connection of its own")
	}

	// Closing nine keeps the tenth served and its invalidations heard.
	for _, c := range caches[:9] {
		require.NoError(t, c.Close())
	}
	last := caches[9]
	require.True(t, eventually(func() bool { return fillNear(t, last, "k") }), "the last cache stopped serving memory")
	require.NoError(t, admin.Set(t.Context(), "pc9:k", "written elsewhere", 0).Err())
	assert.True(t, eventually(func() bool { return !nearHas(last, "k") }), "the write's invalidation did not reach the last cache")
	require.NoError(t, last.Close())
	assert.True(t, eventually(func() bool { _, n := subscribedConns(t, admin); return n == 0 }), "tracking connections after the last Close")
}

// On a Ring of two shards: at most two subscribed connections per shard.
func TestTenCachesOnARingHoldTwoPerShard(t *testing.T) {
	a, b := redistest.NewServer(t), redistest.NewServer(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	tenNearCaches(t, ring, nil)
	for _, s := range []*redistest.Server{a, b} {
		all, tracking := subscribedConns(t, redistest.Client(t, s.Addr))
		t.Logf("shard %s: %d subscribed connections, %d of them tracking", s.Addr, all, tracking)
		assert.LessOrEqual(t, all, 2, "subscribed connections on shard %s", s.Addr)
		assert.Equal(t, 1, tracking, "tracking connections on shard %s", s.Addr)
	}
}

// fillNear reads key through c and reports whether it is now in memory.
func fillNear(t *testing.T, c *Cache[product], key string) bool {
	t.Helper()
	_, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.NoError(t, err)
	return nearHas(c, key)
}

// TestSharedConnectionDeliversEachPrefix: readers of prefixes A and B on
// one client share a tracking connection; writes of B in another process
// reach B's reader before they return, every time, and leave A's memory
// alone; writes of A reach A's.
func TestSharedConnectionDeliversEachPrefix(t *testing.T) {
	admin, p := setup(t)
	pa, pb := p+"a:", p+"b:"
	rdb := redistest.Client(t, redistest.Addr(t))
	ra, _ := newNearCacheOn(t, rdb, pa)
	rb, _ := newNearCacheOn(t, rdb, pb)
	require.Equal(t, trackingClientID(t, ra), trackingClientID(t, rb), "the readers do not share a tracking connection")
	wb, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), pb)
	wa, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), pa)
	markOld(t, admin, pa, pb)

	require.True(t, eventually(func() bool { return fillNear(t, ra, "k") }), "A's value never reached memory")
	for i := range 20 {
		want := "b" + strconv.Itoa(i)
		require.True(t, eventually(func() bool { return fillNear(t, rb, "k") }), "round %d: B's value never reached memory", i)
		require.NoError(t, wb.Set(t.Context(), "k", product{ID: want}))
		got, err := rb.Get(t.Context(), "k")
		require.NoError(t, err)
		require.Equal(t, want, got.ID, "round %d: a read of B after the write returned", i)
	}
	assert.True(t, nearHas(ra, "k"), "B's writes dropped A's key")
	require.NoError(t, wa.Delete(t.Context(), "k"))
	_, err := ra.Get(t.Context(), "k")
	assert.True(t, errors.Is(err, ErrCacheMiss), "a read of A after its Delete returned: %v", err)
}

// markOld makes the prefixes' registries older than a lease, or the first
// writes wait out one lease whatever the acknowledgements.
func markOld(t *testing.T, admin *redis.Client, prefixes ...string) {
	t.Helper()
	for _, p := range prefixes {
		require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())
	}
}

// TestKillingTheSharedConnectionDropsEveryPrefix: the tracking connection
// of two prefixes is killed: both caches stop serving and empty their
// memory, since writes of either may have been missed, and both serve again
// on a new connection.
func TestKillingTheSharedConnectionDropsEveryPrefix(t *testing.T) {
	admin, p := setup(t)
	rdb := redistest.Client(t, redistest.Addr(t))
	ra, eva := newNearCacheOn(t, rdb, p+"a:")
	rb, evb := newNearCacheOn(t, rdb, p+"b:")
	for _, c := range []*Cache[product]{ra, rb} {
		require.True(t, eventually(func() bool { return fillNear(t, c, "k") }), "a value never reached memory")
	}
	id := trackingClientID(t, ra)
	dropsA, dropsB := eva.get(EventNearDrop), evb.get(EventNearDrop)
	require.NoError(t, admin.ClientKillByFilter(context.Background(), "ID", strconv.FormatInt(id, 10)).Err())
	for name, c := range map[string]*Cache[product]{"A": ra, "B": rb} {
		assert.True(t, eventually(func() bool { return !nearHas(c, "k") }), "%s kept its memory when the connection was killed", name)
	}
	// The event follows the emptying: wait for it too.
	assert.True(t, eventually(func() bool { return eva.get(EventNearDrop) > dropsA }), "A's memory was not dropped")
	assert.True(t, eventually(func() bool { return evb.get(EventNearDrop) > dropsB }), "B's memory was not dropped")
	for _, c := range []*Cache[product]{ra, rb} {
		require.True(t, eventually(func() bool { return nearReady(c) && trackingClientID(t, c) != id }), "never served again on a new connection")
		require.True(t, eventually(func() bool { return fillNear(t, c, "k") }), "a value never reached memory again")
	}
	require.NoError(t, admin.Set(t.Context(), p+"b:k", "written elsewhere", 0).Err())
	assert.True(t, eventually(func() bool { return !nearHas(rb, "k") }), "B's invalidation did not arrive on the new connection")
}
