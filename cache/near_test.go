// This file proves the near cache against a real Redis: hits without a
// round trip, drops on every kind of write (this library, another client,
// an expiry), the read/invalidation race, drops when the invalidation
// connection is lost, and the byte budget.

package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/rediserr"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"log/slog"
	"maps"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// Tests of a writer without a near cache among readers with one:
// its writes wait for the readers' acknowledgements like any
// writer's, it holds no lease, and on a prefix without holders it opens no
// subscription and waits for nothing.

// trackingDialer dials connections that call before and after (nil: not)
// around each read once they turned client-side caching on: the near
// cache's tracking connections. Its other connections are untouched.
func trackingDialer(before, after func()) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		cn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &trackingConn{Conn: cn, before: before, after: after}, nil
	}
}

type trackingConn struct {
	net.Conn
	before, after func()
	tracking      atomic.Bool // the connection asked for CLIENT TRACKING
}

func (c *trackingConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("TRACKING")) {
		c.tracking.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *trackingConn) Read(b []byte) (int, error) {
	if c.tracking.Load() && c.before != nil {
		c.before()
	}
	n, err := c.Conn.Read(b)
	if c.tracking.Load() && c.after != nil {
		c.after()
	}
	return n, err
}

// slowTracking is a dialer whose tracking connections read each reply
// late: the reader's invalidations land delay after Redis sent them, as
// over a slow or busy link.
func slowTracking(delay time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return trackingDialer(func() { time.Sleep(delay) }, nil)
}

// mixedReader is a Cache with a near cache whose invalidations arrive late.
func mixedReader(t *testing.T, p string) *Cache[product] {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: slowTracking(20 * time.Millisecond)})
	t.Cleanup(func() { _ = rdb.Close() })
	c, _ := newNearCacheOn(t, rdb, p)
	return c
}

// TestWriterWithoutNearCacheWaitsForReaders: readers with near caches whose
// invalidations come 20ms late, a writer with WithoutNearCache() (an admin
// job configured differently): every read that begins after Set or Delete
// returned, through Get or GetOrLoad, gets the new value, and the writer
// is acknowledged, not made to wait out the readers' leases. Without the
// writer's confirmation most reads got the old value from memory.
func TestWriterWithoutNearCacheWaitsForReaders(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	readers := []*Cache[product]{mixedReader(t, p), mixedReader(t, p)}
	wev := &events{}
	w := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache(), wev.option())
	defer w.Close()
	// A registry older than a lease, or the first write waits out one
	// lease whatever the acknowledgements.
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())

	inMemory := func(r *Cache[product], want string) bool {
		v, err := r.Get(t.Context(), "k")
		return err == nil && v.ID == want && nearHas(r, "k")
	}
	const rounds = 30
	stale := 0
	for i := range rounds {
		old := "v" + strconv.Itoa(i)
		if i == 0 {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: old}))
		}
		for _, r := range readers {
			require.True(t, eventually(func() bool { return inMemory(r, old) }), "round %d: %q never reached a reader's memory", i, old)
		}
		next := "v" + strconv.Itoa(i+1)
		if i%5 == 4 { // a Delete, then the next value through a load
			require.NoError(t, w.Delete(t.Context(), "k"))
		} else {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: next}))
		}
		for j, r := range readers {
			var got product
			var err error
			if j == 0 {
				got, err = r.Get(t.Context(), "k")
				if i%5 == 4 { // deleted
					if !errors.Is(err, ErrCacheMiss) {
						require.NoError(t, err)
						stale++
					}
					continue
				}
			} else {
				got, err = r.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: next}, nil })
			}
			require.NoError(t, err)
			if got.ID != next {
				stale++
			}
		}
		if i%5 == 4 {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: next}))
		}
	}
	assert.Zero(t, stale, "reads that began after the writer's Set or Delete returned and got the old value, in %d", rounds*len(readers))
	assert.Zero(t, wev.get(EventNearLeaseWait), "the writer waited out a reader's lease: acknowledgements did not reach it")
	assert.Zero(t, wev.get(EventNearHit), "a Cache without a near cache served from memory")
	n, err := admin.HLen(t.Context(), coherence.RegistryKey(p)).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1+len(readers), n, "the registry holds ~since and the readers' leases, not the writer")
}

// A writer without a near cache on a prefix that nobody holds: its writes
// open no subscription and wait for nothing but the registry's reply, in
// the same round trip as the write on a single server.
func TestWriterWithoutNearCacheAloneIsNotSlowed(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	require.NoError(t, admin.HSet(t.Context(), coherence.HoldRegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())
	rdb := redistest.Client(t, redistest.Addr(t))
	cmds := redistest.CountCommands(rdb)
	w := New[product](rdb, WithPrefix(p), WithoutNearCache())
	defer w.Close()
	for i := range 20 {
		require.NoError(t, w.Set(t.Context(), "k", product{ID: strconv.Itoa(i)}))
		require.NoError(t, w.Delete(t.Context(), "k"))
	}
	chans, err := admin.PubSubChannels(t.Context(), p+"stampede:near:ack:*").Result()
	require.NoError(t, err)
	assert.Empty(t, chans, "a writer with no holders to hear opened an acknowledgement subscription")
	assert.Zero(t, cmds.Count("subscribe"), "SUBSCRIBEs")
	assert.Zero(t, cmds.Count("publish"), "markers published again")
	ttl := admin.PTTL(t.Context(), coherence.HoldRegistryKey(p)).Val()
	assert.Greater(t, ttl, 9*time.Minute, "the writers' registry is kept ten minutes past their last write")
	assert.Zero(t, admin.Exists(t.Context(), coherence.RegistryKey(p)).Val(), "writers made the registry of holders that track by prefix, which makes every write wait for everyone")
}

// A writer without a near cache holds no lease: a write of a near-cached
// Cache is never made to wait for it, whether or not it wrote before.
func TestWriterWithoutNearCacheHoldsNoLease(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())
	nw := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache())
	defer nw.Close()
	require.NoError(t, nw.Set(t.Context(), "k", product{ID: "a"}))
	w, wev := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p)
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "b"}))
	fields, err := admin.HKeys(t.Context(), coherence.RegistryKey(p)).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"~since", w.near.track.ID()}, fields)
	assert.Zero(t, wev.get(EventNearLeaseWait))
	assert.Nil(t, nw.near, "a Cache without a near cache keeps memory")
}

// Tests of strict coherence through a Cache, piece by piece
// (internal/coherence tests the tracker alone): a process without a lease
// serves nothing, a holder that does not acknowledge is waited for until its
// lease ends, a lost registry makes writes wait out one lease, Close gives
// the lease back, and the registry and marker keys are reserved. The whole
// is attacked across OS processes in the reliability module.

// serverMillis is the Redis server's clock, as the scripts read it.
func serverMillis(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(t.Context()).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// limitedClient is a client of a private server, logged in as a user who
// may do everything but what deny takes away (say "-hset"), then what it
// gives back ("-client", "+client|id").
func limitedClient(t *testing.T, deny ...string) *redis.Client {
	t.Helper()
	srv := redistest.PrivateServer(t, "it creates an ACL user")
	admin := redistest.Client(t, srv.Addr)
	args := []any{"ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all"}
	for _, d := range deny {
		args = append(args, d)
	}
	require.NoError(t, admin.Do(t.Context(), args...).Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limited", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// A process whose lease cannot be renewed (here its ACL user may not HSET,
// which the renewal script does) reads through Redis and never from memory,
// and says so once in its log.
func TestNearCacheWithoutLeaseServesNothing(t *testing.T) {
	t.Parallel()
	rdb := limitedClient(t, "-hset")
	ev := &events{}
	logs := &logCapture{}
	c := New[product](rdb, WithPrefix("nl:"), ev.option(), WithLogger(slog.New(logs)))
	defer c.Close()
	require.True(t, eventually(func() bool { return c.near.track.Sure() }), "never sure of its invalidations")
	src := &counter{}
	for range 200 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		time.Sleep(time.Millisecond) // past several renewal attempts
	}
	assert.Zero(t, ev.get(EventNearHit), "near hits without a lease")
	assert.Equal(t, int64(1), src.calls.Load(), "reads went to Redis and found the value")
	lines := logs.lines(slog.LevelError)
	require.Len(t, lines, 1, "one report for every failed renewal: %q", lines)
	assert.Contains(t, lines[0], "near cache not serving")
	assert.Contains(t, lines[0], "the lease script") // the refusal itself is worded differently by each Redis
}

// TestNearCacheServesUnderANarrowClientRule: a security review narrows
// +@all to the CLIENT subcommands the near cache needs (ID, TRACKING); the
// tracking connection's name (CLIENT SETNAME) is refused, which must not
// keep the near cache from serving.
func TestNearCacheServesUnderANarrowClientRule(t *testing.T) {
	t.Parallel()
	rdb := limitedClient(t, "-client", "+client|id", "+client|tracking")
	ev := &events{}
	c := New[product](rdb, WithPrefix("nc:"), ev.option())
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }), "the near cache never served under -client +client|id +client|tracking")
	src := &counter{}
	for range 10 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	assert.Positive(t, ev.get(EventNearHit), "reads served from memory (none when the connection setup fails)")
}

// A listed holder that never acknowledges (one registered by hand) is waited
// for until its lease ends, without an error; a ctx that ends first gets an
// error that says the value was written.
func TestWriteWaitsOutASilentHolder(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	ev := &events{}
	c := New[product](rdb, WithPrefix(p), ev.option())
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }))
	lease := 400 * time.Millisecond
	require.NoError(t, rdb.HSet(t.Context(), coherence.RegistryKey(p), "silent", serverMillis(t, rdb)+lease.Milliseconds()).Err())

	began := time.Now()
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "a"}))
	assert.GreaterOrEqual(t, time.Since(began), lease/2, "Set returned long before the silent holder's lease ended")
	assert.Equal(t, int64(1), ev.get(EventNearLeaseWait))

	require.NoError(t, rdb.HSet(t.Context(), coherence.RegistryKey(p), "silent", serverMillis(t, rdb)+10_000).Err())
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := c.Delete(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "written, but near caches not confirmed")
	assert.Zero(t, rdb.Exists(t.Context(), p+"k").Val(), "the Delete itself was done")
}

// A writer whose own acknowledgement channel is not subscribed yet (a Cache
// just created, its tracking connection still dialing) loses the holders'
// first acknowledgements; it asks again (the marker, republished after the
// write) as soon as its subscription is confirmed, neither waiting out their
// leases nor the quarter lease of its timed asks.
func TestWriterAsksAgainForLostAcknowledgements(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	// Leases so long that the writer's first timed ask (a quarter lease, 5 s)
	// comes after the Set's deadline below: only the ask made when its
	// subscription is confirmed (400 ms) gets the write confirmed in time.
	const leaseLen = 20 * time.Second
	r, _, _ := newNearCache(t, p, WithNearLease(leaseLen))
	src := &counter{}
	require.True(t, eventually(func() bool { // the old value in r's memory
		_, err := r.GetOrLoad(t.Context(), "k", src.load)
		return err == nil && nearHas(r, "k")
	}))
	// A registry older than a lease, or the write waits out one lease
	// whatever the acknowledgements (see TestLostRegistryMakesWritesWaitOneLease).
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-leaseLen.Milliseconds()).Err())
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), OnConnect: func(ctx context.Context, cn *redis.Conn) error {
		if name, _ := cn.ClientGetName(ctx).Result(); name == "stampede-near" {
			time.Sleep(400 * time.Millisecond) // the writer's tracking connection comes late
		}
		return nil
	}})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Ping(t.Context()).Err())
	wev := &events{}
	w := New[product](rdb, WithPrefix(p), WithNearCache(1<<20), WithNearLease(leaseLen), wev.option())
	defer w.Close()
	require.False(t, w.near.track.Sure(), "the test wants the write made before the writer's subscription")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	require.NoError(t, w.Set(ctx, "k", product{ID: "v1"}), "not confirmed before the writer's first timed ask")
	assert.Zero(t, wev.get(EventNearLeaseWait), "the writer waited out a running holder's lease: its lost acknowledgement was not asked for again")
	got, err := r.GetOrLoad(t.Context(), "k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "v1", got.ID, "the reader's memory served the old value after Set returned")
}

// Two processes' caches (two clients): writes are acknowledged, not waited
// out, and the other cache's memory never serves a value after a write of
// it returned.
func TestWritesAreAcknowledged(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	w, _, wev := newNearCache(t, p)
	r, _, rev := newNearCache(t, p)
	src := &counter{}
	for i := range 50 {
		_, err := r.GetOrLoad(t.Context(), "k", src.load) // in memory (after the first)
		require.NoError(t, err)
		want := product{ID: "v" + string(rune('a'+i%26))}
		require.NoError(t, w.Set(t.Context(), "k", want))
		got, err := r.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		require.Equal(t, want.ID, got.ID, "round %d: the other cache served the old value after Set returned", i)
	}
	assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out a running holder's lease")
	assert.Positive(t, rev.get(EventNearHit))
}

// A registry created within a lease (here deleted, as FLUSHALL or an
// eviction would) may have forgotten running leases: the next write waits
// one lease from its creation.
func TestLostRegistryMakesWritesWaitOneLease(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	lease := 400 * time.Millisecond
	c := New[product](rdb, WithPrefix(p), WithNearLease(lease))
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }))
	time.Sleep(lease) // the registry is older than a lease
	began := time.Now()
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "a"}))
	quick := time.Since(began)

	require.NoError(t, rdb.Del(t.Context(), coherence.RegistryKey(p)).Err())
	began = time.Now()
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "b"}))
	assert.GreaterOrEqual(t, time.Since(began), lease/2, "Set after the registry was lost (the first took %v)", quick)
}

// Close gives the lease back: writers no longer list the closed holder.
func TestCloseResigns(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithPrefix(p))
	require.True(t, eventually(func() bool { return nearReady(c) }))
	id := c.near.track.ID()
	require.True(t, eventually(func() bool { return rdb.HExists(t.Context(), coherence.RegistryKey(p), id).Val() }), "never registered")
	require.NoError(t, c.Close())
	assert.False(t, rdb.HExists(t.Context(), coherence.RegistryKey(p), id).Val(), "a closed cache still holds its lease")
}

// A Cache closing while another process writes acknowledges the writes
// that still counted on it (their registry read came before it gave its
// lease back) instead of leaving them to wait out its lease: Close gives
// the lease back first, takes in the markers sent before with a PING, and
// acknowledges them before it closes its connections.
func TestCloseDuringWritesIsNotWaitedOut(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	// Leases long enough that a write waiting one out would outlast the
	// writers' 3 s deadline below.
	const leaseLen = 10 * time.Second
	w, _, wev := newNearCache(t, p, WithNearLease(leaseLen))
	// A registry older than a lease, or every write waits one out.
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-leaseLen.Milliseconds()).Err())
	src := &counter{}
	for round := range 5 {
		r, _, _ := newNearCache(t, p, WithNearLease(leaseLen))
		_, err := r.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		var wg sync.WaitGroup
		var writes atomic.Int64
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil && writes.Add(1) <= 200 {
					if err := w.Set(ctx, "k", product{ID: "v"}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		for writes.Load() < 20 && ctx.Err() == nil && len(errs) == 0 {
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, r.Close())
		wg.Wait()
		cancel()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "round %d: a write waited for the closed cache", round)
		}
	}
	assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out the lease of a cache that closed")
}

// The registries and the marker keys are reserved: no value can be stored
// where they live, whatever the Cache's prefix (the registry's name does
// not begin with its own).
func TestCoherenceKeysAreReserved(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithPrefix(p))
	defer c.Close()
	bare := New[product](rdb, WithoutNearCache()) // no prefix: the registries of every prefix are keys it could name
	defer bare.Close()
	for _, k := range []string{coherence.RegistryKey(p), coherence.RegistryKey("{x}" + p), coherence.LegacyRegistryKey(p), coherence.MarkKeyPrefix(p) + "w:1"} {
		local := strings.TrimPrefix(k, p)
		cc := c
		if local == k {
			cc = bare
		}
		err := cc.Set(t.Context(), local, product{})
		assert.True(t, errors.Is(err, ErrReservedKey), "Set(%q): %v", local, err)
		_, err = cc.GetOrLoad(t.Context(), local, (&counter{}).load)
		assert.True(t, errors.Is(err, ErrReservedKey), "GetOrLoad(%q): %v", local, err)
	}
	// A name like a registry's that is not one is a key like any other.
	require.NoError(t, bare.Set(t.Context(), "{x}:stampede:near:"+p, product{}))
}

// On a Ring (no cluster bus) the marker is published on every shard: writes
// are acknowledged by another Ring's near cache, and read-after-write holds.
func TestRingWritesAreAcknowledged(t *testing.T) {
	t.Parallel()
	a := redistest.PrivateServer(t, "it runs a two-shard Ring")
	b := redistest.NewServer(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	wev, rev := &events{}, &events{}
	w := New[product](ring(), WithPrefix("ring:"), wev.option())
	defer w.Close()
	r := New[product](ring(), WithPrefix("ring:"), rev.option())
	defer r.Close()
	require.True(t, eventually(func() bool { return nearReady(w) && nearReady(r) }))
	src := &counter{}
	for i := range 40 {
		key := "k" + string(rune('a'+i%8)) // keys on both shards
		_, err := r.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
		want := product{ID: "v" + string(rune('a'+i))}
		require.NoError(t, w.Set(t.Context(), key, want))
		got, err := r.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
		require.Equal(t, want.ID, got.ID, "round %d: the other Ring's memory served the old value after Set returned", i)
	}
	assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out a running holder's lease: markers did not reach every shard")
	assert.Positive(t, rev.get(EventNearHit))
}

// A client that moves to another server (as a Sentinel failover moves it,
// closing its connections to the old master) while its tracking connection
// stays on the old one, which still answers: the lease renewal now runs on a server this process does not
// track, so memory stops being served (the old value stayed in it, since
// the new server's writes are reported to nobody here) and the tracking
// connection moves to the client's server.
func TestNearCacheFollowsItsClientToAnotherServer(t *testing.T) {
	t.Parallel()
	a := redistest.PrivateServer(t, "it moves a client between two servers")
	b := redistest.PrivateServer(t, "it moves a client between two servers")
	var target atomic.Value
	target.Store(a.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: "switched", Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, target.Load().(string))
	}})
	defer rdb.Close()
	ev := &events{}
	c := New[product](rdb, WithPrefix("sw:"), WithTTL(time.Hour), WithNearMaxAge(time.Hour), ev.option())
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }))
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "old"}))
	require.True(t, eventually(func() bool {
		v, err := c.Get(t.Context(), "k")
		return err == nil && v.ID == "old" && nearHas(c, "k")
	}), "the old value never reached memory")
	before := ev.get(EventNearHit)

	onB := New[product](redistest.Client(t, b.Addr), WithPrefix("sw:"), WithoutNearCache())
	defer onB.Close()
	require.NoError(t, onB.Set(t.Context(), "k", product{ID: "new"}))
	target.Store(b.Addr)
	// The client's connections to a end (go-redis's failover client closes
	// them on a switch); the tracking connection, a subscriber, stays.
	admA := redistest.Client(t, a.Addr)
	require.NoError(t, admA.ClientKillByFilter(t.Context(), "TYPE", "normal").Err())

	var got product
	require.True(t, eventually(func() bool {
		var err error
		got, err = c.Get(t.Context(), "k")
		return err == nil && got.ID == "new"
	}), "memory kept serving the old server's value: %+v", got)
	assert.Greater(t, ev.get(EventNearHit), before, "memory served before the switch")
	require.True(t, eventually(func() bool {
		return strings.Contains(redistest.Client(t, b.Addr).ClientList(t.Context()).Val(), "name=stampede-near")
	}), "the tracking connection did not move to the client's server")
	require.True(t, eventually(func() bool { return nearReady(c) }), "never sure again on the new server")
	for range 100 {
		v, err := c.Get(t.Context(), "k")
		require.NoError(t, err)
		require.Equal(t, "new", v.ID)
	}
}

// Every command the near cache needs (docs/GUARANTEES.md, Redis ACLs),
// refused one at a time: the near cache never serves, and says so once,
// naming the command or the script that ran it.
func TestNearCacheRefusedEachCommandItNeedsSaysSo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule  []string // "-cmd|sub" is Redis 7 only: a subcommand is denied by allowing the others
		named string
	}{
		{[]string{"-client", "+client|id", "+client|setname"}, "CLIENT"},
		{[]string{"-client", "+client|tracking", "+client|setname"}, "CLIENT"},
		{[]string{"-info"}, "INFO: NOPERM"},
		{[]string{"-time"}, "LEASE SCRIPT"},    // Redis names the script's line, not the command
		{[]string{"-hset"}, "LEASE SCRIPT"},    // Redis names the script's line, not the command
		{[]string{"-exists"}, "LEASE SCRIPT"},  // Redis names the script's line, not the command
		{[]string{"-pexpire"}, "LEASE SCRIPT"}, // Redis names the script's line, not the command
		{[]string{"-evalsha"}, "EVALSHA"},
	} {
		t.Run(strings.Join(tc.rule, " "), func(t *testing.T) {
			t.Parallel()
			rdb := limitedClient(t, tc.rule...)
			logs := &logCapture{}
			c := New[product](rdb, WithPrefix("nr:"), WithLogger(slog.New(logs)))
			defer c.Close()
			require.True(t, eventually(func() bool { return len(logs.lines(slog.LevelError)) > 0 }), "no report")
			time.Sleep(300 * time.Millisecond) // several more attempts
			lines := logs.lines(slog.LevelError)
			require.Len(t, lines, 1, "%q", lines)
			assert.Contains(t, lines[0], "near cache not serving")
			assert.Contains(t, strings.ToUpper(lines[0]), tc.named)
			assert.False(t, nearReady(c))
		})
	}
}
