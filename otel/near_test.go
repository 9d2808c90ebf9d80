// This file checks the near-cache figures on a real near cache against
// the test Redis: hits served from memory, a key invalidated by another
// client's write, keys evicted by a small byte budget, and a drop when the
// invalidation connection is cut.

package cacheotel_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
	cacheotel "github.com/stampede-go/stampede/otel"
	"go.opentelemetry.io/otel/attribute"
)

// eventually polls cond for up to 10s (a loaded -race run is slow) and
// reports whether it held.
func eventually(cond func() bool) bool { return redistest.Eventually(10*time.Second, cond) }

// settled fails the test unless the counter's data point with exactly attrs
// comes to equal seen, the events the cache emitted (an event being
// delivered makes them differ for a moment), and returns it.
func settled(t *testing.T, m *meter, seen *atomic.Int64, metric string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	var got, want int64
	if !eventually(func() bool {
		want = seen.Load()
		got = counter(m.collect(t), metric, attrs...)
		return got == want && seen.Load() == want
	}) {
		t.Errorf("%s%v = %d; want %d, the events the cache emitted", metric, attrs, got, want)
	}
	return got
}

// TestObserverNearCache: each near-cache event becomes one count of its
// metric, and a near hit is not a cache.lookups.
func TestObserverNearCache(t *testing.T) {
	addr := redistest.Addr(t)
	var (
		mu     sync.Mutex
		conns  []net.Conn // every connection of rdb, the tracking one included
		refuse atomic.Bool
	)
	rdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("test: dial refused")
		}
		var d net.Dialer
		cn, err := d.DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, cn)
			mu.Unlock()
		}
		return cn, err
	}})
	t.Cleanup(func() { _ = rdb.Close() })
	direct := redistest.Client(t, addr)
	p := redistest.Prefix(t, direct)

	m := newMeter(t)
	obs := m.observer(t, "products")
	var seen [256]atomic.Int64 // events by kind, counted after the adapter got them
	// A budget of a dozen entries or so: the cold keys below overflow it.
	c := cache.New[string](rdb, cache.WithPrefix(p), cache.WithNearCache(4<<10), cache.WithObserver(func(e cache.Event) {
		obs(e)
		seen[e.Kind].Add(1)
	}))
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	calls := 0
	get := func(key string) {
		t.Helper()
		calls++
		if _, err := c.GetOrLoad(ctx, key, func(context.Context) (string, error) { return "espresso", nil }); err != nil {
			t.Fatalf("GetOrLoad(%q): %v", key, err)
		}
	}

	// Hits: once the tracker is sure of its invalidations, the hot key is
	// read from memory.
	if !eventually(func() bool { get("k"); return seen[cache.EventNearHit].Load() > 0 }) {
		t.Fatal("no near hit: the near cache never served the key from memory")
	}
	for range 20 {
		get("k")
	}
	if got := settled(t, m, &seen[cache.EventNearHit], "cache.near.hits", name("products")); got < 21 {
		t.Errorf("cache.near.hits = %d; want at least 21", got)
	}
	points := m.collect(t)
	// One caller at a time: each call is a near hit or one read of Redis.
	lookups := counter(points, "cache.lookups", name("products"), lookup("hit")) +
		counter(points, "cache.lookups", name("products"), lookup("miss"))
	if near := counter(points, "cache.near.hits", name("products")); near+lookups != int64(calls) {
		t.Errorf("cache.near.hits %d + cache.lookups %d = %d; want %d, the calls", near, lookups, near+lookups, calls)
	}

	// Invalidation: another client deletes the key, while it is in memory
	// (a near hit just now: an entry lives at most WithNearMaxAge, 2s).
	hits := seen[cache.EventNearHit].Load()
	if !eventually(func() bool { get("k"); return seen[cache.EventNearHit].Load() > hits }) {
		t.Fatal("the hot key is no longer served from memory")
	}
	before := seen[cache.EventNearInvalidation].Load()
	if err := direct.Del(ctx, p+"k").Err(); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool { return seen[cache.EventNearInvalidation].Load() > before }) {
		t.Fatal("no invalidation after another client deleted the key")
	}
	settled(t, m, &seen[cache.EventNearInvalidation], "cache.near.removals", name("products"), cacheotel.KeyNearReason.String("invalidation"))

	// Evictions: cold keys, each read twice, overflow the budget.
	for j := range 200 {
		get(fmt.Sprint("cold", j))
		get(fmt.Sprint("cold", j))
	}
	if !eventually(func() bool { return seen[cache.EventNearEviction].Load() > 0 }) {
		t.Fatal("no eviction after 200 cold keys through a 4 KB near cache")
	}
	settled(t, m, &seen[cache.EventNearEviction], "cache.near.removals", name("products"), cacheotel.KeyNearReason.String("eviction"))

	// Drop: the connections (the tracking one among them) are cut and
	// cannot be redialled for a while.
	before = seen[cache.EventNearDrop].Load()
	refuse.Store(true)
	mu.Lock()
	for _, cn := range conns {
		_ = cn.Close()
	}
	mu.Unlock()
	if !eventually(func() bool { return seen[cache.EventNearDrop].Load() > before }) {
		t.Fatal("no drop after the invalidation connection was cut")
	}
	refuse.Store(false)
	if got := settled(t, m, &seen[cache.EventNearDrop], "cache.near.drops", name("products")); got <= before {
		t.Errorf("cache.near.drops = %d; want more than %d, the drops before the cut", got, before)
	}
	noKey(t, m.collect(t), p)
}
