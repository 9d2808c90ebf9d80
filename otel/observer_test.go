// This file runs real cache operations against the test Redis and
// reads the figures back through the SDK's manual reader; it also feeds each
// kind of event to the observer directly, for the kinds a test cannot cause
// on demand.

package cacheotel_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
	cacheotel "github.com/stampede-go/stampede/otel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
)

func setup(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	return rdb, redistest.Prefix(t, rdb)
}

// TestObserverGetOrLoad: one key read calls times with a loader that
// returns err; the lookups and loads the figures show, and nothing else.
func TestObserverGetOrLoad(t *testing.T) {
	tests := []struct {
		name          string
		err           error // the loader's
		calls         int
		hits, misses  int64
		loads         uint64
		outcome       string
		wantCallsLoad int
	}{
		{"value", nil, 10, 9, 1, 1, "ok", 1},
		{"not found, cached", cache.ErrNotFound, 3, 2, 1, 1, "not_found", 1},
		{"error, not cached", errors.New("database down"), 3, 0, 3, 3, "error", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, p := setup(t)
			m := newMeter(t)
			// Without the near cache: the test counts lookups that reach Redis.
			c := cache.New[string](rdb, cache.WithPrefix(p), cache.WithObserver(m.observer(t, "products")), cache.WithoutNearCache())
			t.Cleanup(func() { _ = c.Close() })
			var loaderCalls int
			load := func(context.Context) (string, error) {
				loaderCalls++
				return "espresso", tt.err
			}
			for range tt.calls {
				_, _ = c.GetOrLoad(t.Context(), "product:42", load)
			}
			if loaderCalls != tt.wantCallsLoad {
				t.Fatalf("loader called %d times; want %d", loaderCalls, tt.wantCallsLoad)
			}

			points := m.collect(t)
			if got := counter(points, "cache.lookups", name("products"), lookup("hit")); got != tt.hits {
				t.Errorf("cache.lookups{hit} = %d; want %d", got, tt.hits)
			}
			if got := counter(points, "cache.lookups", name("products"), lookup("miss")); got != tt.misses {
				t.Errorf("cache.lookups{miss} = %d; want %d", got, tt.misses)
			}
			load1, ok := find(points, "cache.load.duration", name("products"), outcome(tt.outcome))
			if !ok || load1.count != tt.loads || load1.sum <= 0 {
				t.Errorf("cache.load.duration{%s} = count %d, sum %gs (found: %v); want count %d, sum > 0",
					tt.outcome, load1.count, load1.sum, ok, tt.loads)
			}
			if load1.unit != "s" || !slices.Equal(load1.bounds, cacheotel.Buckets) {
				t.Errorf("cache.load.duration: unit %q, bounds %v; want \"s\", %v", load1.unit, load1.bounds, cacheotel.Buckets)
			}
			if got, want := names(points), []string{"cache.load.duration", "cache.lookups"}; !slices.Equal(got, want) {
				t.Errorf("metrics recorded: %v; want %v", got, want)
			}
			if got, want := len(points), 1+min(1, int(tt.hits))+1; got != want {
				t.Errorf("%d data points; want %d: %+v", got, want, points)
			}
			noKey(t, points, "product:42")
		})
	}
}

// TestObserverContention: two caches (as two processes would) on one key;
// the second finds the first loading, waits, and gets its value. Each
// cache's figures carry its own name.
func TestObserverContention(t *testing.T) {
	rdb, p := setup(t)
	m := newMeter(t)
	a := cache.New[string](rdb, cache.WithPrefix(p), cache.WithObserver(m.observer(t, "a")))
	obsB := m.observer(t, "b")
	contended := make(chan struct{})
	var once sync.Once
	b := cache.New[string](rdb, cache.WithPrefix(p), cache.WithObserver(func(e cache.Event) {
		obsB(e)
		if e.Kind == cache.EventLockContended {
			once.Do(func() { close(contended) })
		}
	}))
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })

	loading := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := a.GetOrLoad(t.Context(), "k", func(context.Context) (string, error) {
			close(loading)
			<-contended // b is waiting for this load
			return "from a", nil
		})
		done <- err
	}()
	<-loading
	var bLoads atomic.Int32
	v, err := b.GetOrLoad(t.Context(), "k", func(context.Context) (string, error) {
		bLoads.Add(1)
		return "from b", nil
	})
	if err := <-done; err != nil {
		t.Fatalf("a.GetOrLoad: %v", err)
	}
	if err != nil || v != "from a" || bLoads.Load() != 0 {
		t.Fatalf("b.GetOrLoad = %q, %v, after %d loads; want \"from a\", nil, after 0", v, err, bLoads.Load())
	}

	points := m.collect(t)
	for _, n := range []string{"a", "b"} {
		if got := counter(points, "cache.lookups", name(n), lookup("miss")); got != 1 {
			t.Errorf("cache.lookups{%s, miss} = %d; want 1", n, got)
		}
	}
	if n, _ := histogram(points, "cache.load.duration", name("a"), outcome("ok")); n != 1 {
		t.Errorf("cache.load.duration{a, ok} count = %d; want 1", n)
	}
	if got := counter(points, "cache.lock.contentions", name("b")); got != 1 {
		t.Errorf("cache.lock.contentions{b} = %d; want 1", got)
	}
	wait, ok := find(points, "cache.wait.duration", name("b"), outcome("ok"))
	if !ok || wait.count != 1 || wait.sum <= 0 {
		t.Errorf("cache.wait.duration{b, ok} = count %d, sum %gs; want count 1, sum > 0", wait.count, wait.sum)
	}
	for _, pt := range points {
		if v, _ := pt.attrs.Value(cacheotel.KeyName); v.AsString() == "a" &&
			(pt.metric == "cache.lock.contentions" || pt.metric == "cache.wait.duration") {
			t.Errorf("%s recorded for a, which did not wait", pt.metric)
		}
		if v, _ := pt.attrs.Value(cacheotel.KeyName); v.AsString() == "b" && pt.metric == "cache.load.duration" {
			t.Errorf("cache.load.duration recorded for b, which did not load")
		}
	}
	if got := counter(points, "cache.wait.woken", name("b")); got > 1 {
		t.Errorf("cache.wait.woken{b} = %d; want at most 1 (one wait)", got)
	}
}

// TestObserverBreaker: Redis unreachable for two calls opens a breaker of
// threshold 2; once Redis is back, the probe after the cool-down closes it.
func TestObserverBreaker(t *testing.T) {
	addr := redistest.Addr(t)
	var down atomic.Bool
	down.Store(true)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			return nil, errors.New("test: Redis is down")
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}})
	t.Cleanup(func() { _ = rdb.Close() })
	p := redistest.Prefix(t, redistest.Client(t, addr))

	m := newMeter(t)
	obs := m.observer(t, "products")
	var closed atomic.Bool
	c := cache.New[string](rdb, cache.WithPrefix(p), cache.WithCircuitBreaker(2, 20*time.Millisecond),
		cache.WithObserver(func(e cache.Event) {
			obs(e)
			if e.Kind == cache.EventBreakerClose {
				closed.Store(true)
			}
		}))
	t.Cleanup(func() { _ = c.Close() })
	load := func(context.Context) (string, error) { return "v", nil }
	for range 3 { // two outages open the breaker; the third call does not try Redis
		if _, err := c.GetOrLoad(t.Context(), "k", load); err != nil {
			t.Fatalf("GetOrLoad under FailOpen: %v", err)
		}
	}
	points := m.collect(t)
	if got := counter(points, "cache.redis.errors", name("products")); got != 2 {
		t.Errorf("cache.redis.errors = %d; want 2", got)
	}
	if got := counter(points, "cache.breaker.transitions", name("products"), cacheotel.KeyBreakerState.String("open")); got != 1 {
		t.Errorf("cache.breaker.transitions{open} = %d; want 1", got)
	}
	if got := counter(points, "cache.breaker.open", name("products")); got != 1 {
		t.Errorf("cache.breaker.open = %d while open; want 1", got)
	}
	if n, _ := histogram(points, "cache.load.duration", name("products"), outcome("ok")); n != 3 {
		t.Errorf("cache.load.duration{ok} count = %d; want 3 (FailOpen loads without Redis)", n)
	}

	down.Store(false)
	for deadline := time.Now().Add(30 * time.Second); !closed.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not close within 30s of Redis coming back")
		}
		if _, err := c.GetOrLoad(t.Context(), "k", load); err != nil {
			t.Fatalf("GetOrLoad: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	points = m.collect(t)
	if got := counter(points, "cache.breaker.transitions", name("products"), cacheotel.KeyBreakerState.String("closed")); got != 1 {
		t.Errorf("cache.breaker.transitions{closed} = %d; want 1", got)
	}
	if got := counter(points, "cache.breaker.open", name("products")); got != 0 {
		t.Errorf("cache.breaker.open = %d once closed; want 0", got)
	}
	if got := counter(points, "cache.redis.errors", name("products")); got != 2 {
		t.Errorf("cache.redis.errors = %d after Redis came back; want still 2", got)
	}
}

// TestObserverStale: a value past its TTL is served stale while one
// background refresh reloads it (WithStale).
func TestObserverStale(t *testing.T) {
	rdb, p := setup(t)
	m := newMeter(t)
	c := cache.New[string](rdb, cache.WithPrefix(p), cache.WithTTL(20*time.Millisecond), cache.WithoutJitter(),
		cache.WithEarlyRefresh(0), cache.WithStale(time.Minute), cache.WithObserver(m.observer(t, "products")))
	var loads atomic.Int32
	load := func(context.Context) (string, error) { return fmt.Sprint("v", loads.Add(1)), nil }
	if v, err := c.GetOrLoad(t.Context(), "k", load); err != nil || v != "v1" {
		t.Fatalf("GetOrLoad = %q, %v; want v1", v, err)
	}
	time.Sleep(50 * time.Millisecond) // past the TTL, well within the stale period
	if v, err := c.GetOrLoad(t.Context(), "k", load); err != nil || v != "v1" {
		t.Fatalf("GetOrLoad past the TTL = %q, %v; want the stale v1", v, err)
	}
	if err := c.Close(); err != nil { // waits for the refresh
		t.Fatal(err)
	}
	if loads.Load() != 2 {
		t.Fatalf("%d loads; want 2 (the first, the refresh)", loads.Load())
	}

	points := m.collect(t)
	if got := counter(points, "cache.stale.served", name("products"), cacheotel.KeyStaleReason.String("refreshing")); got != 1 {
		t.Errorf("cache.stale.served{refreshing} = %d; want 1", got)
	}
	refresh, ok := find(points, "cache.refresh.duration", name("products"), outcome("ok"))
	if !ok || refresh.count != 1 || refresh.sum <= 0 {
		t.Errorf("cache.refresh.duration{ok} = count %d, sum %gs; want count 1, sum > 0", refresh.count, refresh.sum)
	}
	noKey(t, points, p+"k")
}

// TestObserverEachKind feeds one event of each kind to an observer and
// checks the one data point it makes, for the kinds the other tests cannot
// cause on demand too (stale values, refreshes, notifications, lost locks).
func TestObserverEachKind(t *testing.T) {
	failed := errors.New("failed")
	tests := []struct {
		event  cache.Event
		metric string // "" means no data point at all
		attrs  []attribute.KeyValue
	}{
		{cache.Event{Kind: cache.EventHit}, "cache.lookups", []attribute.KeyValue{lookup("hit")}},
		{cache.Event{Kind: cache.EventMiss}, "cache.lookups", []attribute.KeyValue{lookup("miss")}},
		{cache.Event{Kind: cache.EventLoad, Duration: time.Second}, "cache.load.duration", []attribute.KeyValue{outcome("ok")}},
		{cache.Event{Kind: cache.EventLoad, Duration: time.Second, Err: cache.ErrNotFound}, "cache.load.duration", []attribute.KeyValue{outcome("not_found")}},
		{cache.Event{Kind: cache.EventLoad, Duration: time.Second, Err: failed}, "cache.load.duration", []attribute.KeyValue{outcome("error")}},
		{cache.Event{Kind: cache.EventLockContended}, "cache.lock.contentions", nil},
		{cache.Event{Kind: cache.EventWait, Duration: time.Second}, "cache.wait.duration", []attribute.KeyValue{outcome("ok")}},
		{cache.Event{Kind: cache.EventWait, Duration: time.Second, Err: cache.ErrLockNotAcquired}, "cache.wait.duration", []attribute.KeyValue{outcome("error")}},
		{cache.Event{Kind: cache.EventWoken}, "cache.wait.woken", nil},
		{cache.Event{Kind: cache.EventLockLost, Err: cache.ErrLoadLockLost}, "cache.lock.lost", nil},
		{cache.Event{Kind: cache.EventLoadVoided}, "cache.load.voided", nil},
		{cache.Event{Kind: cache.EventStaleServed}, "cache.stale.served", []attribute.KeyValue{cacheotel.KeyStaleReason.String("refreshing")}},
		{cache.Event{Kind: cache.EventStaleServed, Err: failed}, "cache.stale.served", []attribute.KeyValue{cacheotel.KeyStaleReason.String("error")}},
		{cache.Event{Kind: cache.EventRefresh, Duration: time.Second}, "cache.refresh.duration", []attribute.KeyValue{outcome("ok")}},
		{cache.Event{Kind: cache.EventWrite, Duration: time.Second}, "cache.write.duration", []attribute.KeyValue{outcome("ok")}},
		{cache.Event{Kind: cache.EventRefresh, Duration: time.Second, Err: failed}, "cache.refresh.duration", []attribute.KeyValue{outcome("error")}},
		{cache.Event{Kind: cache.EventRefresh, Duration: time.Second, Err: fmt.Errorf("wrapped: %w", cache.ErrNotFound)}, "cache.refresh.duration", []attribute.KeyValue{outcome("not_found")}},
		{cache.Event{Kind: cache.EventRedisError, Err: failed}, "cache.redis.errors", nil},
		{cache.Event{Kind: cache.EventBreakerOpen, Err: failed}, "cache.breaker.transitions", []attribute.KeyValue{cacheotel.KeyBreakerState.String("open")}},
		{cache.Event{Kind: cache.EventBreakerClose}, "cache.breaker.transitions", []attribute.KeyValue{cacheotel.KeyBreakerState.String("closed")}},
		{cache.Event{Kind: cache.EventNearHit}, "cache.near.hits", nil},
		{cache.Event{Kind: cache.EventNearInvalidation}, "cache.near.removals", []attribute.KeyValue{cacheotel.KeyNearReason.String("invalidation")}},
		{cache.Event{Kind: cache.EventNearEviction}, "cache.near.removals", []attribute.KeyValue{cacheotel.KeyNearReason.String("eviction")}},
		{cache.Event{Kind: cache.EventNearDrop}, "cache.near.drops", nil},
		{cache.Event{Kind: cache.EventNearLeaseWait}, "cache.near.lease_waits", nil},
		{cache.Event{Kind: cache.EventDecodeError, Err: failed}, "cache.decode.errors", nil},
		{cache.Event{Kind: cache.EventEncodeError, Err: failed}, "cache.encode.errors", nil},
		{cache.Event{Kind: cache.EventUncachedLoad}, "cache.loads.uncached", nil},
		{cache.Event{Kind: cache.EventQuarantined}, "cache.decode.quarantined", nil},
		{cache.Event{Kind: 0}, "", nil},
		{cache.Event{Kind: 200}, "", nil},
	}
	for _, tt := range tests {
		name := tt.event.Kind.String()
		if tt.event.Err != nil {
			name += "/" + tt.event.Err.Error()
		}
		t.Run(name, func(t *testing.T) {
			m := newMeter(t)
			tt.event.Key = "secret-key-42"
			m.observer(t, "c", cacheotel.WithAttributes(attribute.String("region", "eu")))(tt.event)
			points := m.collect(t)
			if open, ok := find(points, "cache.breaker.open", cacheotel.KeyName.String("c"), attribute.String("region", "eu")); ok {
				want := map[cache.EventKind]int64{cache.EventBreakerOpen: 1, cache.EventBreakerClose: -1}[tt.event.Kind]
				if want == 0 || open.value != want {
					t.Errorf("cache.breaker.open = %d after %v; want %d", open.value, tt.event.Kind, want)
				}
				points = slices.DeleteFunc(points, func(p point) bool { return p.metric == "cache.breaker.open" })
			}
			if tt.metric == "" {
				if len(points) != 0 {
					t.Fatalf("data points %+v; want none", points)
				}
				return
			}
			if len(points) != 1 {
				t.Fatalf("%d data points %+v; want 1", len(points), points)
			}
			attrs := append([]attribute.KeyValue{cacheotel.KeyName.String("c"), attribute.String("region", "eu")}, tt.attrs...)
			want := attribute.NewSet(attrs...)
			got := points[0]
			if got.metric != tt.metric || !got.attrs.Equals(&want) {
				t.Errorf("recorded %s %v; want %s %v", got.metric, got.attrs.ToSlice(), tt.metric, want.ToSlice())
			}
			if got.bounds != nil { // a histogram
				if got.count != 1 || got.sum != 1 || got.unit != "s" {
					t.Errorf("%s: count %d, sum %g %s; want 1, 1 s", got.metric, got.count, got.sum, got.unit)
				}
			} else if got.value != 1 {
				t.Errorf("%s = %d; want 1", got.metric, got.value)
			}
			noKey(t, points, tt.event.Key)
		})
	}
}

// TestObserverOptions: the global MeterProvider by default; the attributes
// of WithAttributes do not override the package's own; an empty name is an
// error.
func TestObserverOptions(t *testing.T) {
	m := newMeter(t)
	otel.SetMeterProvider(m.provider) // this test binary's global, for good
	obs, err := cacheotel.Observer("global", cacheotel.WithAttributes(cacheotel.KeyName.String("override")))
	if err != nil {
		t.Fatal(err)
	}
	obs(cache.Event{Kind: cache.EventHit})
	if got := counter(m.collect(t), "cache.lookups", name("global"), lookup("hit")); got != 1 {
		t.Errorf("cache.lookups{global, hit} through the global MeterProvider = %d; want 1", got)
	}

	if _, err := cacheotel.Observer("", cacheotel.WithMeterProvider(m.provider)); err == nil {
		t.Error(`Observer("") succeeded; want an error`)
	}
}

// TestObserverAllocations: an event costs no allocation of the observer's
// own (the no-op provider records nothing, so any allocation is ours), and
// none in the SDK either once a data point exists.
func TestObserverAllocations(t *testing.T) {
	m := newMeter(t)
	providers := map[string]func() func(cache.Event){
		"noop": func() func(cache.Event) {
			obs, err := cacheotel.Observer("c", cacheotel.WithMeterProvider(noop.NewMeterProvider()))
			if err != nil {
				t.Fatal(err)
			}
			return obs
		},
		"sdk": func() func(cache.Event) { return m.observer(t, "c") },
	}
	for pname, newObs := range providers {
		obs := newObs()
		for k := cache.EventHit; k <= cache.EventNearDrop; k++ {
			e := cache.Event{Kind: k, Key: "k", Duration: time.Millisecond, Err: errors.New("failed")}
			obs(e) // the SDK creates the data point on first use
			if n := testing.AllocsPerRun(100, func() { obs(e) }); n != 0 {
				t.Errorf("%s: %s event: %v allocations; want 0", pname, k, n)
			}
		}
	}
}
