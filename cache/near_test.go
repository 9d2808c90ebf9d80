// This file proves the near cache against a real Redis: hits without a
// round trip, drops on every kind of write (this library, another client,
// an expiry), the read/invalidation race, drops when the invalidation
// connection is lost, and the byte budget.

package cache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/rediserr"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// events counts a Cache's events by kind.
type events struct{ n [64]atomic.Int64 }

func (e *events) observe(ev Event)      { e.n[ev.Kind].Add(1) }
func (e *events) get(k EventKind) int64 { return e.n[k].Load() }
func (e *events) option() Option        { return WithObserver(e.observe) }
func nearReady[V any](c *Cache[V]) bool { return c.near.track.Serving() } // sure and leased
func nearHas[V any](c *Cache[V], k string) bool {
	_, ok := c.near.store.GetIfPresent(k)
	return ok
}

// eventually polls cond for up to 5s (a loaded -race run is slow) and reports
// whether it held.
func eventually(cond func() bool) bool { return redistest.Eventually(5*time.Second, cond) }

// eventuallyWithin is eventually for up to d.
func eventuallyWithin(d time.Duration, cond func() bool) bool { return redistest.Eventually(d, cond) }

// newNearCache returns a near-cached Cache on its own client (as another
// process would have), ready to serve from memory.
func newNearCache(t *testing.T, prefix string, opts ...Option) (*Cache[product], *redis.Client, *events) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	c, ev := newNearCacheOn(t, rdb, prefix, opts...)
	return c, rdb, ev
}

// newNearCacheCounting is newNearCache with a command counter on its
// client, added before the Cache exists: the near cache's goroutines use the
// client at once, and go-redis before v9.6 does not allow adding a hook to a
// client in use.
func newNearCacheCounting(t *testing.T, prefix string) (*Cache[product], *redistest.Commands, *events) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	cmds := redistest.CountCommands(rdb)
	c, ev := newNearCacheOn(t, rdb, prefix)
	return c, cmds, ev
}

func newNearCacheOn(t *testing.T, rdb *redis.Client, prefix string, opts ...Option) (*Cache[product], *events) {
	t.Helper()
	ev := &events{}
	c := New[product](rdb, append([]Option{WithPrefix(prefix), WithNearCache(1 << 20), ev.option()}, opts...)...)
	t.Cleanup(func() { c.Close() })
	require.True(t, eventually(func() bool { return nearReady(c) }), "the near cache never became sure of its invalidations")
	return c, ev
}

func TestNearCacheServesHitsFromMemory(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, gets, ev := newNearCacheCounting(t, p)
	src := &counter{}
	for range 100 {
		v, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		assert.Equal(t, "p1", v.ID)
	}
	assert.Equal(t, int64(1), src.calls.Load())
	// The first call misses; the next reads Redis until a read's reply is
	// not voided by the invalidation that the load's own commit echoes back
	// (a round trip or two); the rest are memory.
	assert.LessOrEqual(t, gets.Count("get"), 5, "GETs for 100 reads")
	assert.GreaterOrEqual(t, ev.get(EventNearHit), int64(95))

	// Each caller gets its own copy.
	a, _ := c.GetOrLoad(t.Context(), "k", src.load)
	a.Tags["sale"] = "changed"
	b, _ := c.GetOrLoad(t.Context(), "k", src.load)
	assert.Equal(t, "yes", b.Tags["sale"], "a caller's change reached another caller")
}

// An entry is served only once keep checked its ticket after storing it:
// in between, a read that began after a write returned could get an entry
// whose check is about to fail (a reader preempted between the two). Here
// an entry stands stored and never checked: it is not served, and the read
// goes to Redis.
func TestNearCacheServesNoEntryBeforeItsCheck(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, ev := newNearCacheCounting(t, p)
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "new"}))
	old, err := c.cfg.codec.Marshal(product{ID: "old"})
	require.NoError(t, err)
	c.near.store.Set("k", &nearEntry[product]{data: old, until: clock.Now() + int64(time.Hour)})
	v, err := c.Get(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "new", v.ID, "served an entry whose ticket was never checked")
	assert.Zero(t, ev.get(EventNearHit))
}

func TestNearCacheServesGet(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, gets, ev := newNearCacheCounting(t, p)
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "set"}))
	for range 50 {
		v, err := c.Get(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, "set", v.ID)
	}
	assert.LessOrEqual(t, gets.Count("get")+gets.Count("mget"), 5, "Redis reads for 50 Gets")
	assert.GreaterOrEqual(t, ev.get(EventNearHit), int64(45))
}

func TestNearCacheSharedValues(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, ev := newNearCache(t, p, WithNearShared())
	src := &counter{}
	for range 3 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	// Two reads both served from memory (a renewal late on a loaded machine
	// can send one to Redis: then try again).
	var a, b product
	require.True(t, eventually(func() bool {
		hits := ev.get(EventNearHit)
		a, _ = c.GetOrLoad(t.Context(), "k", src.load)
		b, _ = c.GetOrLoad(t.Context(), "k", src.load)
		return ev.get(EventNearHit) == hits+2
	}), "no two reads in a row from memory")
	a.Tags["x"] = "y"
	assert.Equal(t, "y", b.Tags["x"], "WithNearShared hands out one value")
}

// TestNearCacheDroppedOnEveryWrite: a write of the key by another Cache (its
// Delete, Set, load), by a client that is not this library, and the key's
// expiry in Redis each drop it from memory; the next read gets the new value.
func TestNearCacheDroppedOnEveryWrite(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	reader, _, ev := newNearCache(t, p)
	writer, direct, _ := newNearCache(t, p)
	ctx := t.Context()
	src := &counter{}
	prime := func(key string) {
		t.Helper()
		require.True(t, eventually(func() bool {
			_, err := reader.GetOrLoad(ctx, key, src.load)
			require.NoError(t, err)
			return nearHas(reader, key)
		}), "%s never reached memory", key)
	}
	dropped := func(key, how string) {
		t.Helper()
		assert.True(t, eventually(func() bool { return !nearHas(reader, key) }), "%s: still in memory", how)
	}

	prime("del")
	require.NoError(t, writer.Delete(ctx, "del"))
	dropped("del", "Delete in another Cache")

	prime("set")
	require.NoError(t, writer.Set(ctx, "set", product{ID: "new"}))
	dropped("set", "Set in another Cache")
	v, err := reader.GetOrLoad(ctx, "set", src.load)
	require.NoError(t, err)
	assert.Equal(t, "new", v.ID)

	prime("ext")
	require.NoError(t, direct.Set(ctx, p+"ext", "operator wrote this", 0).Err())
	dropped("ext", "SET by redis-cli")

	prime("exp")
	require.NoError(t, direct.PExpire(ctx, p+"exp", time.Millisecond).Err())
	time.Sleep(5 * time.Millisecond)
	direct.Exists(ctx, p+"exp") // an access expires it at once
	dropped("exp", "expiry in Redis")
	// The event follows the removal: wait for the last one too.
	assert.True(t, eventually(func() bool { return ev.get(EventNearInvalidation) >= 4 }), "invalidation events: %d, want 4", ev.get(EventNearInvalidation))
}

// slowConn delays every read, as a congested link would.
type slowConn struct {
	net.Conn
	delay time.Duration
}

func (c slowConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	time.Sleep(c.delay) // what arrived is handed over late
	return n, err
}

// TestNearCacheOwnWritesDropBeforeReturning: this process's Delete and Set
// drop the key from its memory before they return, without waiting for
// Redis's invalidation (delayed here by a slow tracking connection).
func TestNearCacheOwnWritesDropBeforeReturning(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	var slow atomic.Bool
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		cn, err := d.DialContext(ctx, network, addr)
		if err == nil && slow.Load() {
			cn = slowConn{cn, 300 * time.Millisecond}
		}
		return cn, err
	}})
	t.Cleanup(func() { rdb.Close() })
	ev := &events{}
	c := New[product](rdb, WithPrefix(p), WithNearCache(1<<20), ev.option())
	t.Cleanup(func() { c.Close() })
	require.True(t, eventually(func() bool { return nearReady(c) }))
	ctx := t.Context()
	for _, k := range []string{"a", "b"} { // the pool's connections, dialed fast
		_, err := c.GetOrLoad(ctx, k, (&counter{}).load)
		require.NoError(t, err)
	}
	slow.Store(true)
	direct := redistest.Client(t, redistest.Addr(t))
	require.NoError(t, direct.ClientKillByFilter(ctx, "ID", strconv.FormatInt(trackingClientID(t, c), 10)).Err())
	require.True(t, eventually(func() bool { return !nearReady(c) }))
	// Each of the resubscription's replies comes 300 ms late: about 4 s on
	// an idle machine, more than 5 on a busy one.
	require.True(t, eventuallyWithin(30*time.Second, func() bool { return nearReady(c) }), "the slow connection never subscribed")
	src := &counter{}
	for _, k := range []string{"a", "b"} {
		require.True(t, eventually(func() bool {
			_, err := c.GetOrLoad(ctx, k, src.load)
			require.NoError(t, err)
			return nearHas(c, k)
		}))
	}
	require.NoError(t, c.Delete(ctx, "a"))
	assert.False(t, nearHas(c, "a"), "Delete returned with the key in memory")
	require.NoError(t, c.Set(ctx, "b", product{ID: "new"}))
	assert.False(t, nearHas(c, "b"), "Set returned with the key in memory")
	v, err := c.GetOrLoad(ctx, "b", src.load)
	require.NoError(t, err)
	assert.Equal(t, "new", v.ID)
}

// invalidateDuringGet is a hook that, once armed, writes the key through
// another client after a GET's reply arrived and before the cache sees it,
// and waits until the reader's tracker has applied the invalidation: the
// reply is then older than the invalidation.
type invalidateDuringGet struct {
	armed   atomic.Bool
	write   func()
	applied func() bool
}

func (h *invalidateDuringGet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *invalidateDuringGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "get" && h.armed.CompareAndSwap(true, false) {
			h.write()
			eventually(h.applied)
		}
		return err
	}
}
func (h *invalidateDuringGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestNearCacheReplyOlderThanInvalidationIsNotKept: the race the
// caching-in-progress placeholder exists for. Without the ticket check, the
// old reply stays in memory after its invalidation came.
func TestNearCacheReplyOlderThanInvalidationIsNotKept(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	// The hook goes on before the Cache exists (go-redis before v9.6 does not
	// allow adding one to a client in use); it does nothing until armed.
	rdb := redistest.Client(t, redistest.Addr(t))
	h := &invalidateDuringGet{}
	rdb.AddHook(h)
	reader, _ := newNearCacheOn(t, rdb, p)
	direct := redistest.Client(t, redistest.Addr(t))
	ctx := t.Context()
	src := &counter{}
	_, err := reader.GetOrLoad(ctx, "k", src.load) // stored in Redis
	require.NoError(t, err)
	reader.near.store.InvalidateAll()

	tk0 := reader.near.track.Ticket(p + "k")
	h.write = func() { direct.Set(ctx, p+"k", "written by someone else", 0) }
	h.applied = func() bool { return reader.near.track.Invalidated(tk0) }
	h.armed.Store(true) // publishes write and applied to the hook's goroutine
	v, err := reader.GetOrLoad(ctx, "k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID, "the reply read before the write")
	assert.False(t, h.armed.Load(), "the hook did not run")
	assert.False(t, nearHas(reader, "k"), "a reply older than its key's invalidation was kept in memory")
}

// TestNearCacheDropsEverythingWhenTheConnectionIsLost: killing the
// invalidation connection empties memory at once and serves nothing from it
// while the connection cannot come back (its dials are refused); a write
// made meanwhile is seen; once back, it tracks again.
func TestNearCacheDropsEverythingWhenTheConnectionIsLost(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	var refuse atomic.Bool
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("dial refused by the test")
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}})
	t.Cleanup(func() { rdb.Close() })
	ev := &events{}
	reader := New[product](rdb, WithPrefix(p), WithNearCache(1<<20), ev.option())
	t.Cleanup(func() { reader.Close() })
	require.True(t, eventually(func() bool { return nearReady(reader) }))
	direct := redistest.Client(t, redistest.Addr(t))
	ctx := t.Context()
	src := &counter{}
	for _, k := range []string{"a", "b"} {
		require.True(t, eventually(func() bool {
			_, err := reader.GetOrLoad(ctx, k, src.load)
			require.NoError(t, err)
			return nearHas(reader, k)
		}))
	}
	drops := ev.get(EventNearDrop)
	refuse.Store(true) // the reader's pool keeps its open connections
	require.NoError(t, direct.ClientKillByFilter(ctx, "ID", strconv.FormatInt(trackingClientID(t, reader), 10)).Err())
	require.True(t, eventually(func() bool { return ev.get(EventNearDrop) > drops }), "no drop after the connection was killed")
	require.NoError(t, direct.Set(ctx, p+"b", "written while the connection was down", 0).Err())
	hits := ev.get(EventNearHit)
	_, err := reader.GetOrLoad(ctx, "a", src.load)
	require.NoError(t, err)
	assert.Equal(t, hits, ev.get(EventNearHit), "served from memory while unsure of invalidations")
	assert.False(t, nearHas(reader, "b"), "memory kept an entry across a lost connection")
	assert.False(t, nearReady(reader))

	refuse.Store(false)
	require.True(t, eventually(func() bool { return nearReady(reader) }), "never sure again after the reconnect")
	require.True(t, eventually(func() bool {
		_, err := reader.GetOrLoad(ctx, "a", src.load)
		require.NoError(t, err)
		return nearHas(reader, "a")
	}))
	require.NoError(t, direct.Set(ctx, p+"a", "x", 0).Err())
	assert.True(t, eventually(func() bool { return !nearHas(reader, "a") }), "the reconnected connection does not track")
}

// trackingClientID is the id of c's invalidation connection (one node).
func trackingClientID(t *testing.T, c *Cache[product]) int64 {
	t.Helper()
	ids := c.near.track.ConnIDs()
	require.Len(t, ids, 1)
	return ids[0]
}

func TestNearCacheServesNothingWhileTheBreakerIsOpen(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, ev := newNearCache(t, p)
	src := &counter{}
	require.True(t, eventually(func() bool {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		return nearHas(c, "k")
	}))
	for range DefaultBreakerFailures { // open
		c.brk.Record("k", rediserr.Outage, errors.New("test: an outage"))
	}
	hits := ev.get(EventNearHit)
	_, _ = c.GetOrLoad(t.Context(), "k", src.load)
	assert.Equal(t, hits, ev.get(EventNearHit), "a near hit while the breaker was open")
	c.brk.Record("k", rediserr.None, nil) // closed
}

// TestNearCacheStaysWithinItsBudget: a million distinct keys through a near
// cache of 64 MB leave the heap within the budget plus the stated overhead.
func TestNearCacheStaysWithinItsBudget(t *testing.T) {
	if testing.Short() || raceEnabled {
		// The race detector makes each entry ~30x slower and changes what
		// otter admits; .ci/run runs this test without it.
		t.Skip("a million entries; run without -race")
	}
	_, p := setup(t)
	keys, budget := 1_000_000, int64(64<<20)
	c, _, _ := newNearCache(t, p, WithNearCache(budget))
	payload := []byte(`{"id":"p1","price":1}`)
	fresh := record.Freshness{Expiry: time.Now().Add(time.Hour), Load: time.Millisecond}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range keys {
		key := p + strconv.Itoa(i)
		tk := c.near.track.Ticket(key)
		require.True(t, tk.OK())
		for range 2 { // twice: a key seen once may be refused by the admission filter
			c.near.keep(c, key, tk, &result[product]{data: payload, hasV: true, freshness: fresh})
		}
	}
	c.near.store.CleanUp()
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d MB for a %d MB budget; %d entries kept, weighted size %d MB",
		grew>>20, budget>>20, c.near.store.EstimatedSize(), c.near.store.WeightedSize()>>20)
	assert.LessOrEqual(t, c.near.store.WeightedSize(), uint64(budget))
	assert.Greater(t, c.near.store.WeightedSize(), uint64(budget)/4, "the test did not fill the budget")
	assert.LessOrEqual(t, grew, budget+budget/8, "heap beyond the budget plus 1/8 (otter's tables, the sketch)")
}

// clonedProduct copies itself: near hits clone it instead of decoding.
type clonedProduct struct {
	product
}

var clones atomic.Int64

func (p *clonedProduct) Clone() clonedProduct {
	clones.Add(1)
	c := *p
	c.Tags = maps.Clone(p.Tags)
	return c
}

func TestNearCacheClonesValuesThatCloneThemselves(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	rdb := redistest.Client(t, redistest.Addr(t))
	ev := &events{}
	c := New[clonedProduct](rdb, WithPrefix(p), WithNearCache(1<<20), ev.option())
	t.Cleanup(func() { c.Close() })
	require.True(t, eventually(func() bool { return nearReady(c) }))
	load := func(context.Context) (clonedProduct, error) {
		return clonedProduct{product{ID: "p1", Tags: map[string]string{"sale": "yes"}}}, nil
	}
	for range 10 {
		_, err := c.GetOrLoad(t.Context(), "k", load)
		require.NoError(t, err)
	}
	before := clones.Load()
	a, err := c.GetOrLoad(t.Context(), "k", load)
	require.NoError(t, err)
	a.Tags["sale"] = "changed"
	b, _ := c.GetOrLoad(t.Context(), "k", load)
	assert.Equal(t, "yes", b.Tags["sale"], "a caller's change reached another caller")
	assert.Equal(t, before+2, clones.Load(), "near hits must clone, not decode")
	assert.GreaterOrEqual(t, ev.get(EventNearHit), int64(2))
}

// A Cache dropped without Close gives its near cache back when collected:
// its tracking connections and goroutines end.
func TestNearCacheOfADroppedCacheEnds(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	rdb, p := setup(t)
	before := runtime.NumGoroutine()
	func() {
		c := New[product](rdb, WithPrefix(p))
		require.True(t, eventually(func() bool { return nearReady(c) }))
	}()
	assert.True(t, eventually(func() bool {
		runtime.GC()
		return runtime.NumGoroutine() <= before
	}), "goroutines: %d before, %d after the Cache was dropped", before, runtime.NumGoroutine())
}

// TestNearEventsCarryTheFullKey: Event.Key is the full Redis key (prefix
// included) for every kind; near_hit carried the caller's key and
// near_eviction the store's.
func TestNearEventsCarryTheFullKey(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	var mu sync.Mutex
	keys := map[EventKind][]string{}
	rec := WithObserver(func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		keys[e.Kind] = append(keys[e.Kind], e.Key)
	})
	c, _, _ := newNearCache(t, p, rec, WithNearCache(nearEntryOverhead*4)) // room for a few entries only
	src := &counter{}
	for i := range 40 {
		k := fmt.Sprintf("k%d", i%20)
		_, err := c.GetOrLoad(t.Context(), k, src.load)
		require.NoError(t, err)
	}
	require.True(t, eventually(func() bool { // a loaded machine may renew the lease late
		_, err := c.GetOrLoad(t.Context(), "k19", src.load)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		return len(keys[EventNearHit]) > 0
	}), "no near hit")
	c.near.store.CleanUp()
	count := func(kind EventKind) int { mu.Lock(); defer mu.Unlock(); return len(keys[kind]) }
	hits := count(EventNearHit)
	_, err := c.GetOrLoad(t.Context(), "k19", nil)
	assert.ErrorIs(t, err, ErrNilLoader)
	assert.Equal(t, hits, count(EventNearHit), "a call refused for its nil loader is no near hit")
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, keys[EventNearHit], "near hits")
	require.NotEmpty(t, keys[EventNearEviction], "evictions")
	assert.GreaterOrEqual(t, c.Stats().NearEvictions, int64(len(keys[EventNearEviction])), "Stats counts the evictions the observer saw (counted before observed)")
	for _, kind := range []EventKind{EventNearHit, EventNearEviction, EventMiss, EventLoad} {
		for _, k := range keys[kind] {
			assert.True(t, strings.HasPrefix(k, p), "%v Key = %q; want the full key, under %q", kind, k, p)
		}
	}
}

// TestNearCacheDropsMemoryWhenItsConnectionIsReset: the reader's tracking
// connection is reset right before another process's write; the write's
// invalidation is lost with it. A read that begins after the write
// returned must not get the old value from memory, which only dropping
// memory on the loss and on the resubscription guarantees (the writer's
// marker may reach the new connection and be acknowledged).
func TestNearCacheDropsMemoryWhenItsConnectionIsReset(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	reader, _, _ := newNearCache(t, p)
	writer, _, _ := newNearCache(t, p)
	direct := redistest.Client(t, redistest.Addr(t))
	ctx := t.Context()
	stale := 0
	for round := range 10 {
		want := fmt.Sprintf("v%d", round)
		require.NoError(t, writer.Set(ctx, "k", product{ID: want}))
		require.True(t, eventually(func() bool {
			v, err := reader.GetOrLoad(ctx, "k", (&counter{}).load)
			require.NoError(t, err)
			return v.ID == want && nearHas(reader, "k")
		}), "round %d: the reader never kept the value", round)
		require.True(t, eventually(func() bool { return nearReady(reader) }))
		require.NoError(t, direct.ClientKillByFilter(ctx, "ID", strconv.FormatInt(trackingClientID(t, reader), 10)).Err())
		next := fmt.Sprintf("v%d-new", round)
		require.NoError(t, writer.Set(ctx, "k", product{ID: next}))
		for range 20 { // reads that began after the Set returned
			v, err := reader.GetOrLoad(ctx, "k", (&counter{}).load)
			require.NoError(t, err)
			if v.ID != next {
				stale++
			}
		}
	}
	assert.Zero(t, stale, "reads after a Set returned that got the older value from memory")
}
