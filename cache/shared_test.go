// This file proves that the caches on one Redis client share one set
// of resources: one subscribed connection per master, one breaker whose
// transitions every cache hears, one health log (an outage logged once,
// and again after a recovery, through the caches' loggers), released by the
// last Close.

package cache

import (
	"context"
	"errors"
	"fmt"
	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/health"
	"github.com/stampede-go/stampede/internal/notify"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// typedCache is what the test needs of a Cache of any value type.
type typedCache interface {
	Close() error
	waitOnce(ctx context.Context, key string) error // a GetOrLoad that waits for another holder
	breakerOf() *health.Breaker
	healthOf() *health.State
	notifierOf() *notify.Notifier
}

func (c *Cache[V]) waitOnce(ctx context.Context, key string) error {
	_, err := c.GetOrLoad(ctx, key, func(context.Context) (V, error) {
		var zero V
		return zero, errors.New("the lock is held elsewhere: no load expected")
	})
	return err
}
func (c *Cache[V]) breakerOf() *health.Breaker { return c.brk }
func (c *Cache[V]) healthOf() *health.State    { return c.share.res.health }

// notifierOf is the Notifier of the Cache's client, of which the Cache's
// own (WithPrefix) shares the subscriptions.
func (c *Cache[V]) notifierOf() *notify.Notifier { return c.share.res.notify }

// fiveCaches opens five caches of different value types on rdb, with the
// prefixes "c0:" to "c4:" (one prefix holds one value type).
func fiveCaches(rdb redis.UniversalClient, opts ...Option) []typedCache {
	o := func(i int) []Option { return append(slices.Clone(opts), WithPrefix(fmt.Sprintf("c%d:", i))) }
	return []typedCache{
		New[product](rdb, o(0)...), New[string](rdb, o(1)...), New[int](rdb, o(2)...),
		New[[]byte](rdb, o(3)...), New[map[string]int](rdb, o(4)...),
	}
}

// pubsubClients counts the server's connections in pub/sub mode, but for
// the near caches' tracking connections (one per Cache and master, see
// WithNearCache).
func pubsubClients(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.ClientList(t.Context()).Result()
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name=stampede-near ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "flags=") && strings.Contains(f, "P") {
				n++
			}
		}
	}
	return n
}

func TestCachesOnOneClientShareOneSubscription(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it counts the server's pub/sub connections")
	rdb := redistest.Client(t, srv.Addr)
	admin := redistest.Client(t, srv.Addr)
	caches := fiveCaches(rdb, WithRetry(1, 20*time.Millisecond))
	for i, c := range caches {
		key := "held" + strings.Repeat("x", i) // other keys, other prefixes: other channels
		require.NoError(t, admin.Set(t.Context(), LockKey(fmt.Sprintf("c%d:", i)+key), "someone else", 10*time.Second).Err())
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
	ch := notify.Channel("", "k")
	waitFor(t, func() bool { // the waiter is waiting on the subscription (SSUBSCRIBE, or SUBSCRIBE on Redis < 7)
		return admin.PubSubShardNumSub(t.Context(), ch).Val()[ch]+admin.PubSubNumSub(t.Context(), ch).Val()[ch] == 1
	})
	time.Sleep(50 * time.Millisecond) // and has re-read the key after subscribing, or the commit is found, not heard
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
	start := time.Now() // a closed notifier only polls: it subscribes no more
	assert.False(t, last.notify.Wait(t.Context(), "k", 100*time.Millisecond), "a wait after the last Close")
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "a wait after the last Close polls")
	waitFor(t, func() bool { return pubsubClients(t, admin) == 0 })
}

func TestCachesOnOneClientShareTheBreaker(t *testing.T) {
	t.Parallel()
	rdb, dials := dialCounter(t, deadAddr(t))
	var opened atomic.Int64
	// Without near caches: their tracking connections redial in the
	// background whatever the breaker says, and the test counts the dials
	// of calls.
	caches := fiveCaches(rdb, eventCount(EventBreakerOpen, &opened), WithoutNearCache())
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	for range DefaultBreakerFailures {
		_ = caches[0].waitOnce(t.Context(), "k")
	}
	for i, c := range caches {
		assert.True(t, c.breakerOf().Open(), "breaker of cache %d after one outage", i)
	}
	assert.Equal(t, int64(len(caches)), opened.Load(), "EventBreakerOpen, once to each cache on the breaker")
	before := dials.Load()
	for _, c := range caches[1:] {
		_ = c.waitOnce(t.Context(), "k")
	}
	assert.Equal(t, before, dials.Load(), "the other caches keep off the dead Redis at once")

	// Other settings: a breaker of their own, on the client's health.
	other := New[product](rdb, WithCircuitBreaker(50, time.Minute), WithoutNearCache())
	defer other.Close()
	assert.NotSame(t, caches[0].breakerOf(), other.brk)
	assert.Same(t, caches[0].healthOf(), other.healthOf())
	assert.False(t, other.brk.Open())
}

// TestOneValueTypePerPrefix: a Cache[string] and a Cache[product] on one
// client and prefix overwrote each other's values, each reading the other's
// as a miss. New refuses the second value type while the first is open.
func TestOneValueTypePerPrefix(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	newProduct := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		New[product](rdb, WithPrefix(p)).Close()
		return nil
	}
	a := New[string](rdb, WithPrefix(p))
	b := New[string](rdb, WithPrefix(p)) // the same value type: fine
	New[product](rdb, WithPrefix(p+"other:")).Close()
	err := newProduct()
	require.Error(t, err, "New[product] on the prefix of an open Cache[string]")
	assert.Contains(t, err.Error(), "cache: New: a Cache[string] with prefix")
	assert.Contains(t, err.Error(), "a Cache[cache.product] there would overwrite its values")
	require.NoError(t, a.Close())
	assert.Error(t, newProduct(), "b still holds the prefix")
	require.NoError(t, b.Close())
	assert.NoError(t, newProduct(), "the prefix is free once its Caches are closed")
	assert.NoError(t, newProduct(), "and again")

	// Without a prefix the keys carry their namespaces: shared, no panic.
	New[string](rdb).Close()
	s := New[string](rdb)
	defer s.Close()
	New[product](rdb).Close()
}

// TestDecodeFailuresAreReported: a record the codec cannot read (here a
// string written by another process's Cache[string] on the same prefix)
// was a silent miss; it is now an EventDecodeError on every read path and
// reaches the error hook once per key.
func TestDecodeFailuresAreReported(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	other := New[string](redistest.Client(t, redistest.Addr(t)), WithPrefix(p))
	defer other.Close()
	var events atomic.Int64
	var mu sync.Mutex
	var hooked []string
	c := New[product](rdb, WithPrefix(p), eventCount(EventDecodeError, &events),
		WithErrorHook(func(key string, err error) {
			if strings.Contains(err.Error(), "decode value") {
				mu.Lock()
				hooked = append(hooked, key)
				mu.Unlock()
			}
		}))
	defer c.Close()
	src := &counter{}

	require.NoError(t, other.Set(t.Context(), "k", "text"))
	_, err := c.Get(t.Context(), "k")
	require.ErrorIs(t, err, ErrCacheMiss)
	assert.EqualValues(t, 1, events.Load(), "EventDecodeError after Get")
	_, err = c.GetOrLoad(t.Context(), "k", src.load)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, events.Load(), int64(2), "EventDecodeError after GetOrLoad")
	assert.EqualValues(t, 1, src.calls.Load(), "the unreadable value is replaced by a load")

	require.NoError(t, other.Set(t.Context(), "k", "text"))
	before := events.Load()
	_, err = c.GetOrLoadMany(t.Context(), []string{"k"}, func(_ context.Context, keys []string) (map[string]product, error) {
		return map[string]product{keys[0]: {ID: "many"}}, nil
	})
	require.NoError(t, err)
	assert.Greater(t, events.Load(), before, "EventDecodeError after GetOrLoadMany")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{p + "k"}, hooked, "the error hook hears of the key once")
}

// TestSharedBreakerTellsEveryCache: two Caches on one client share a
// breaker; the observer of the first must hear every transition, whichever
// Cache's call (and whichever path: Set, Delete, GetOrLoad, FailClosed)
// moved it, once each.
func TestSharedBreakerTellsEveryCache(t *testing.T) {
	t.Parallel()
	_, p := setup(t) // its keys, once the test Redis answers at addr
	addr := freeAddr(t)
	rdb, _ := dialCounter(t, addr)
	var opened, closed atomic.Int64
	first := New[product](rdb, WithPrefix(p), WithCircuitBreaker(2, 20*time.Millisecond), WithoutNearCache(), WithObserver(func(e Event) {
		switch e.Kind {
		case EventBreakerOpen:
			opened.Add(1)
		case EventBreakerClose:
			closed.Add(1)
		}
	}))
	defer first.Close()
	second := New[product](rdb, WithPrefix(p), WithCircuitBreaker(2, 20*time.Millisecond), WithoutNearCache(), WithFailurePolicy(FailClosed))
	defer second.Close()
	src := &counter{}
	for range 10 { // only the second Cache's calls: the first must still hear
		_, _ = second.GetOrLoad(t.Context(), "k", src.load)
	}
	assert.Equal(t, int64(1), opened.Load(), "breaker_open heard by the first Cache, opened by the second's calls")
	for range 40 {
		_ = first.Set(t.Context(), "k", product{ID: "1"})
		_ = first.Delete(t.Context(), "k")
		_, _ = first.GetOrLoad(t.Context(), "k", src.load)
		_, _ = second.GetOrLoad(t.Context(), "k", src.load)
	}
	redistest.ProxyAt(t, addr, redistest.Addr(t))
	waitFor(t, func() bool {
		_, err := second.GetOrLoad(t.Context(), "k", src.load)
		return err == nil
	})
	assert.GreaterOrEqual(t, opened.Load(), int64(1))
	assert.Equal(t, opened.Load(), closed.Load(), "every opening heard is followed by one closing")
}

func TestWrongAddressLogsOncePerOutage(t *testing.T) {
	// Not parallel: it replaces slog.Default, where other tests' caches log.
	logs := defaultLogger(t)
	addr := deadAddr(t)
	rdb, _ := dialCounter(t, addr)
	caches := fiveCaches(rdb) // five caches, one client: still one line
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() { _ = caches[i%5].waitOnce(t.Context(), "k") })
	}
	wg.Wait()
	errs := logs.lines(slog.LevelError)
	require.Len(t, errs, 1, "log lines for 100 calls on a wrong address: %q", errs)
	assert.Contains(t, errs[0], "redis="+addr)
	assert.Contains(t, errs[0], "connection refused")

	// Under FailClosed the breaker's error says where and why.
	c := New[product](rdb, WithFailurePolicy(FailClosed))
	defer c.Close()
	_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Contains(t, err.Error(), "cache: circuit breaker open: Redis unreachable: redis at "+addr+": dial tcp "+addr)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Len(t, logs.lines(slog.LevelError), 1, "still one line")
}

func TestOutageLoggedAgainAfterRecovery(t *testing.T) {
	// Not parallel: it replaces slog.Default, where other tests' caches log.
	srv := redistest.PrivateServer(t, "it stops and restarts the server")
	rdb := redis.NewClient(redistest.DialOnce(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true}))
	defer rdb.Close()
	logs := &logCapture{}
	mine := slog.New(logs)
	silent := defaultLogger(t)
	// Without near caches: within their lease they serve "k" from memory
	// during an outage, and the test needs calls that reach Redis.
	a := New[product](rdb, WithLogger(mine), WithCircuitBreaker(2, 20*time.Millisecond), WithoutNearCache())
	defer a.Close()
	b := New[string](rdb, WithLogger(nil), WithoutNearCache()) // off: adds no logger
	defer b.Close()
	calls := func() {
		for range 20 {
			_, _ = a.GetOrLoad(t.Context(), "k", (&counter{}).load)
			_, _ = b.GetOrLoad(t.Context(), "k", func(context.Context) (string, error) { return "v", nil })
		}
	}
	calls()
	assert.Zero(t, logs.count(), "nothing logged while Redis answers")

	srv.Kill()
	calls()
	require.Len(t, logs.lines(slog.LevelError), 1)
	require.NoError(t, srv.Start())
	waitFor(t, func() bool { calls(); return len(logs.lines(slog.LevelInfo)) == 1 })
	assert.Contains(t, logs.lines(slog.LevelInfo)[0], "redis answers again redis="+srv.Addr)
	srv.Kill()
	calls()
	assert.Len(t, logs.lines(slog.LevelError), 2, "a new outage is logged again")
	assert.Zero(t, silent.count(), "nothing went to slog.Default: WithLogger redirects, WithLogger(nil) is off")
}

// The near caches on one Redis client share
// their tracking connections: one per master, for every
// prefix, whose loss drops the memory of every prefix.

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
