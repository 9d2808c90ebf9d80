// shared_test.go proves that the caches on one Redis client share one set
// of resources (issue 18): one subscribed connection per master, one
// breaker, released by the last Close.

package cache

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// typedCache is what the test needs of a Cache of any value type.
type typedCache interface {
	Close() error
	waitOnce(ctx context.Context, key string) error // a GetOrLoad that waits for another holder
	breakerOf() *breaker
	notifierOf() *notifier
}

func (c *Cache[V]) waitOnce(ctx context.Context, key string) error {
	_, err := c.GetOrLoad(ctx, key, func(context.Context) (V, error) {
		var zero V
		return zero, errors.New("the lock is held elsewhere: no load expected")
	})
	return err
}
func (c *Cache[V]) breakerOf() *breaker   { return c.brk }
func (c *Cache[V]) notifierOf() *notifier { return c.notify }

// fiveCaches opens five caches of different value types on rdb.
func fiveCaches(rdb redis.UniversalClient, opts ...Option) []typedCache {
	return []typedCache{
		New[product](rdb, opts...), New[string](rdb, opts...), New[int](rdb, opts...),
		New[[]byte](rdb, opts...), New[map[string]int](rdb, opts...),
	}
}

// pubsubClients counts the server's connections in pub/sub mode.
func pubsubClients(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.ClientList(t.Context()).Result()
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "flags=") && strings.Contains(f, "P") {
				n++
			}
		}
	}
	return n
}

func TestCachesOnOneClientShareOneSubscription(t *testing.T) {
	srv := redistest.PrivateServer(t, "it counts the server's pub/sub connections")
	rdb := redistest.Client(t, srv.Addr)
	admin := redistest.Client(t, srv.Addr)
	caches := fiveCaches(rdb, WithRetry(1, 20*time.Millisecond))
	for i, c := range caches {
		key := "held" + strings.Repeat("x", i) // other keys, other channels
		require.NoError(t, admin.Set(t.Context(), LockKey(key), "someone else", 10*time.Second).Err())
		require.ErrorIs(t, c.waitOnce(t.Context(), key), ErrLockNotAcquired)
	}
	assert.Equal(t, 1, pubsubClients(t, admin), "subscribed connections of 5 caches on one client")
	for _, c := range caches[1:] {
		assert.Same(t, caches[0].notifierOf(), c.notifierOf())
		assert.Same(t, caches[0].breakerOf(), c.breakerOf())
	}

	// Closing 4 keeps the 5th's subscription: a holder's commit wakes it.
	for _, c := range caches[:4] {
		require.NoError(t, c.Close())
	}
	var woken atomic.Int64
	last := New[product](rdb, WithRetry(3, 5*time.Second), eventCount(EventWoken, &woken))
	defer last.Close()
	h := startHolder(t, srv.Addr, "k", false)
	got := make(chan error, 1)
	go func() {
		v, err := last.GetOrLoad(context.Background(), "k", (&counter{}).load)
		if err == nil && v.ID != "holder" {
			err = errors.New("not the holder's value: " + v.ID)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // the waiter is waiting
	h.open(t, false)
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(4 * time.Second):
		t.Fatal("the waiter was not woken by the commit")
	}
	assert.Equal(t, int64(1), woken.Load(), "woken through the subscription the closed caches shared")
	assert.Equal(t, 1, pubsubClients(t, admin), "the client's one subscription")

	// Closing the last two ends the client's subscription and forgets it.
	require.NoError(t, caches[4].Close())
	require.NoError(t, last.Close())
	registry.mu.Lock()
	_, listed := registry.m[rdb]
	registry.mu.Unlock()
	assert.False(t, listed, "the client is forgotten after its last Close")
	n := last.notify
	n.mu.Lock()
	closed, subs := n.closed, len(n.subs)
	n.mu.Unlock()
	assert.True(t, closed)
	assert.Zero(t, subs)
	waitFor(t, func() bool { return pubsubClients(t, admin) == 0 })
}

func TestCachesOnOneClientShareTheBreaker(t *testing.T) {
	rdb, dials := dialCounter(t, deadAddr(t))
	var opened atomic.Int64
	caches := fiveCaches(rdb, eventCount(EventBreakerOpen, &opened))
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	for range DefaultBreakerFailures {
		_ = caches[0].waitOnce(t.Context(), "k")
	}
	for i, c := range caches {
		assert.True(t, c.breakerOf().open(), "breaker of cache %d after one outage", i)
	}
	assert.Equal(t, int64(1), opened.Load(), "EventBreakerOpen, from the cache whose call opened it")
	before := dials.Load()
	for _, c := range caches[1:] {
		_ = c.waitOnce(t.Context(), "k")
	}
	assert.Equal(t, before, dials.Load(), "the other caches keep off the dead Redis at once")

	// Other settings: a breaker of their own, on the client's health.
	other := New[product](rdb, WithCircuitBreaker(50, time.Minute))
	defer other.Close()
	assert.NotSame(t, caches[0].breakerOf(), other.brk)
	assert.Same(t, caches[0].breakerOf().health, other.brk.health)
	assert.False(t, other.brk.open())
}
