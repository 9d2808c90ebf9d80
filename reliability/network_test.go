// This file injects latency, stalls, resets and cuts between the
// library and Redis with an in-process toxiproxy: during a stampede, during
// the commit and during the watchdog's lock refresh.
package reliability_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// procs returns n caches, each on its own client of addr: n simulated
// processes, each with its own singleflight group and connection pool.
func procs(t *testing.T, n int, addr string, tune func(*redis.Options), opts ...cache.Option) []*cache.Cache[string] {
	t.Helper()
	cs := make([]*cache.Cache[string], n)
	for i := range cs {
		cs[i] = cache.New[string](newClient(t, addr, tune), opts...)
		t.Cleanup(func() { _ = cs[i].Close() }) // before the client's Close: cleanups run last first
	}
	return cs
}

func TestNetworkLatencyDuringStampede(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	px := newProxy(t, addr)
	// 50ms each way: every Redis round trip costs 100ms, as across a region.
	px.add(t, "lat-up", "latency", "upstream", `{"latency":50}`)
	px.add(t, "lat-down", "latency", "downstream", `{"latency":50}`)

	key := redistest.Prefix(t, direct) + "k"
	src := newSource(200 * time.Millisecond)
	cs := procs(t, 3, px.Addr(), nil, cache.WithLockTTL(time.Second), cache.WithRetry(200, 20*time.Millisecond))
	start := time.Now()
	out := stampede(t, cs, 20, key, "v", src.loader(key, "v"))
	took := time.Since(start)

	if out.ok != 60 {
		t.Errorf("callers: %v; want 60 ok", out)
	}
	if n := src.loads(key); n != 1 {
		t.Errorf("loads = %d; want 1", n)
	}
	t.Logf("figures: latency 100ms RTT, 3 procs x 20 callers: loads=%d %v, stampede took %v", src.loads(key), out, took.Round(time.Millisecond))
}

// TestNetworkFaultDuringStampede cuts every connection (stall or reset) before a
// stampede and checks both failure policies, then the recovery.
func TestNetworkFaultDuringStampede(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	faults := []struct {
		name, typ, stream, attrs string
	}{
		{"stall", "timeout", "upstream", `{"timeout":0}`},    // packets vanish, nothing answers
		{"reset", "reset_peer", "upstream", `{"timeout":0}`}, // TCP RST on the first byte
	}
	for _, f := range faults {
		for _, policy := range []cache.FailurePolicy{cache.FailOpen, cache.FailClosed} {
			pname := map[cache.FailurePolicy]string{cache.FailOpen: "FailOpen", cache.FailClosed: "FailClosed"}[policy]
			t.Run(f.name+"/"+pname, func(t *testing.T) {
				px := newProxy(t, addr)
				key := redistest.Prefix(t, direct) + "k"
				src := newSource(50 * time.Millisecond)
				const nprocs, callers = 3, 20
				cs := procs(t, nprocs, px.Addr(), fastFail, cache.WithFailurePolicy(policy),
					cache.WithLoadTimeout(3*time.Second), cache.WithRetry(50, 20*time.Millisecond))

				px.add(t, f.name, f.typ, f.stream, f.attrs)
				start := time.Now()
				out := stampede(t, cs, callers, key, "v", src.loader(key, "v"))
				took := time.Since(start)
				loads := src.loads(key)
				switch policy {
				case cache.FailOpen:
					// Every caller is served from the source; singleflight
					// keeps it to one load per process.
					if out.ok != nprocs*callers {
						t.Errorf("callers: %v; want all ok", out)
					}
					if loads < 1 || loads > nprocs {
						t.Errorf("loads = %d; want 1..%d (one per process at most)", loads, nprocs)
					}
				case cache.FailClosed:
					if out.ok != 0 || loads != 0 {
						t.Errorf("callers: %v, loads=%d; want every caller to get the Redis error and no load", out, loads)
					}
				}
				if took > 5*time.Second {
					t.Errorf("stampede took %v; want every call bounded (< 5s)", took)
				}

				// Recovery: once the fault is gone the next call caches again.
				px.remove(t, f.name)
				rec := eventually(t, 5*time.Second, "cache works again", func() bool {
					v, err := cs[0].GetOrLoad(context.Background(), key, src.loader(key, "v"))
					return err == nil && v == "v" && stored(t, direct, key) == `"v"`
				})
				t.Logf("figures: %s %s, 3 procs x 20 callers: loads=%d %v, stampede took %v, recovery %v",
					f.name, pname, loads, out, took.Round(time.Millisecond), rec.Round(time.Millisecond))
			})
		}
	}
}

// TestNetworkCutDuringCommit resets the holder's connections after its
// loader ran and before the fenced commit: the holder's callers still get the
// value, the lock is left to expire, and one other process loads once more.
func TestNetworkCutDuringCommit(t *testing.T) {
	// Not parallel: the wait it bounds is a 500ms lease.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	px := newProxy(t, addr)
	key := redistest.Prefix(t, direct) + "k"
	const lockTTL = 500 * time.Millisecond
	opts := []cache.Option{cache.WithLockTTL(lockTTL), cache.WithRetry(200, 20*time.Millisecond)}
	a := cache.New[string](newClient(t, px.Addr(), fastFail), opts...)
	b := cache.New[string](direct, opts...)

	src := newSource(0)
	entered := make(chan struct{})
	loadA := func(ctx context.Context) (string, error) {
		v, _ := src.loader(key, "A")(ctx)
		px.add(t, "cut", "reset_peer", "upstream", `{"timeout":0}`)
		close(entered)
		return v, nil
	}
	gotA := make(chan error, 1)
	go func() {
		v, err := a.GetOrLoad(context.Background(), key, loadA)
		if err == nil && v != "A" {
			err = errors.New("holder got " + v)
		}
		gotA <- err
	}()
	<-entered
	start := time.Now()
	v, err := b.GetOrLoad(context.Background(), key, src.loader(key, "B"))
	waited := time.Since(start)
	if err != nil || v != "B" {
		t.Fatalf("other process: GetOrLoad = %q, %v; want %q (it loads once the lost commit's lock expires)", v, err, "B")
	}
	if err := <-gotA; err != nil {
		t.Errorf("holder: %v; want the loaded value despite the failed commit", err)
	}
	if n := src.loads(key); n != 2 {
		t.Errorf("loads = %d; want 2 (the failed commit costs exactly one extra load)", n)
	}
	if got := stored(t, direct, key); got != `"B"` {
		t.Errorf("stored = %s; want %q", got, `"B"`)
	}
	if waited < lockTTL/2 || waited > 3*time.Second {
		t.Errorf("other process waited %v; want about the lock TTL %v", waited, lockTTL)
	}
	px.remove(t, "cut")
	rec := eventually(t, 5*time.Second, "holder reads again", func() bool {
		v, err := a.GetOrLoad(context.Background(), key, src.loader(key, "A2"))
		return err == nil && v == "B"
	})
	t.Logf("figures: cut during commit: loads=%d, other process blocked %v (lock TTL %v), holder reads the cache again %v after the cut ends",
		src.loads(key), waited.Round(time.Millisecond), lockTTL, rec.Round(time.Millisecond))
}

// TestNetworkLatencyDuringRefresh slows the holder's link while its loader
// runs for several lock TTLs: the watchdog's refreshes still land in time, so
// nobody else loads.
func TestNetworkLatencyDuringRefresh(t *testing.T) {
	// Not parallel: a refresh late by 200ms more loses the lease.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	px := newProxy(t, addr)
	key := redistest.Prefix(t, direct) + "k"
	const lockTTL = 600 * time.Millisecond
	opts := []cache.Option{cache.WithLockTTL(lockTTL), cache.WithRetry(300, 20*time.Millisecond), cache.WithoutNearCache()} // the lock protocol through latency
	a := cache.New[string](newClient(t, px.Addr(), nil), opts...)
	b := cache.New[string](direct, opts...)

	src := newSource(0)
	entered := make(chan struct{})
	loadA := func(ctx context.Context) (string, error) {
		src.loader(key, "A")(ctx)
		// 100ms each way: a refresh takes 200ms, a third of the lease.
		px.add(t, "lat-up", "latency", "upstream", `{"latency":100}`)
		px.add(t, "lat-down", "latency", "downstream", `{"latency":100}`)
		close(entered)
		time.Sleep(4 * lockTTL)
		return "A", nil
	}
	gotA := make(chan error, 1)
	go func() {
		_, err := a.GetOrLoad(context.Background(), key, loadA)
		gotA <- err
	}()
	<-entered
	v, err := b.GetOrLoad(context.Background(), key, src.loader(key, "B"))
	if err != nil || v != "A" {
		t.Errorf("other process: GetOrLoad = %q, %v; want the holder's %q", v, err, "A")
	}
	if err := <-gotA; err != nil {
		t.Errorf("holder: %v", err)
	}
	if n := src.loads(key); n != 1 {
		t.Errorf("loads = %d; want 1 (the watchdog kept the lease through the latency)", n)
	}
	t.Logf("figures: 200ms RTT during a %v load with lock TTL %v: loads=%d", 4*lockTTL, lockTTL, src.loads(key))
}

// TestNetworkStallDuringRefresh stalls the holder's link so its refreshes
// cannot land: the lease runs out, another process loads (the one extra load
// the design allows) and the holder's late commit is fenced off.
func TestNetworkStallDuringRefresh(t *testing.T) {
	// Not parallel: a 300ms lease.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	px := newProxy(t, addr)
	key := redistest.Prefix(t, direct) + "k"
	const lockTTL = 300 * time.Millisecond
	a := cache.New[string](newClient(t, px.Addr(), fastFail), cache.WithLockTTL(lockTTL), cache.WithRetry(300, 20*time.Millisecond))
	// B's lease is not the one under test: at 300ms a busy machine (load 14
	// on 2 cores, takeover 1.2s after the stall) let it run out before B's
	// commit, which was then refused like A's, and nothing was stored.
	b := cache.New[string](direct, cache.WithLockTTL(5*time.Second), cache.WithRetry(300, 20*time.Millisecond))

	srcA, srcB := newSource(0), newSource(0)
	srcB.entered = make(chan string, 1)
	entered := make(chan struct{})
	var stalled time.Time
	loadA := func(ctx context.Context) (string, error) {
		srcA.loader(key, "A")(ctx)
		px.add(t, "stall", "timeout", "upstream", `{"timeout":0}`)
		stalled = time.Now()
		close(entered)
		select {
		case <-srcB.entered: // the lease was lost and B took over
		case <-time.After(10 * time.Second):
			t.Error("no other process took over the lost lease within 10s")
		}
		px.remove(t, "stall")
		return "A", nil
	}
	gotA := make(chan string, 1)
	go func() {
		v, err := a.GetOrLoad(context.Background(), key, loadA)
		if err != nil {
			t.Errorf("holder: %v", err)
		}
		gotA <- v
	}()
	<-entered
	v, err := b.GetOrLoad(context.Background(), key, srcB.loader(key, "B"))
	takeover := time.Since(stalled)
	if err != nil || v != "B" {
		t.Errorf("other process: GetOrLoad = %q, %v; want its own %q", v, err, "B")
	}
	if v := <-gotA; v != "A" {
		t.Errorf("holder got %q; want its loaded %q", v, "A")
	}
	if got := srcA.loads(key) + srcB.loads(key); got != 2 {
		t.Errorf("loads = %d; want 2 (one extra after the lost lease, no more)", got)
	}
	if got := stored(t, direct, key); got != `"B"` {
		t.Errorf("stored = %s; want %q: the stale holder must not overwrite the newer value", got, `"B"`)
	}
	t.Logf("figures: refresh stalled, lock TTL %v: loads=%d, takeover %v after the stall, stored value %s",
		lockTTL, srcA.loads(key)+srcB.loads(key), takeover.Round(time.Millisecond), stored(t, direct, key))
}
