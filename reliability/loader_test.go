// This file covers loaders that misbehave: slower than the lock TTL,
// returning errors, panicking, and ignoring their context.
package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// TestLoaderSlowerThanLockTTL runs a load five lock TTLs long: the watchdog
// keeps the lease, so no other process loads.
func TestLoaderSlowerThanLockTTL(t *testing.T) {
	// Not parallel, like the other tests of leases under a second.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	key := redistest.Prefix(t, direct) + "k"
	// Not shorter: under -race on 2 busy cores an extension can be tens of
	// milliseconds late, and a lease that short is then lost for real.
	const lockTTL = 600 * time.Millisecond
	src := newSource(5 * lockTTL)
	cs := procs(t, 3, addr, nil, cache.WithLockTTL(lockTTL), cache.WithRetry(300, 20*time.Millisecond))
	start := time.Now()
	out := stampede(t, cs, 10, key, "v", src.loader(key, "v"))
	if out.ok != 30 {
		t.Errorf("callers: %v; want 30 ok", out)
	}
	if n := src.loads(key); n != 1 {
		t.Errorf("loads = %d; want 1 (the watchdog extends the lease)", n)
	}
	t.Logf("figures: load %v with lock TTL %v, 3 procs x 10 callers: loads=%d %v in %v",
		5*lockTTL, lockTTL, src.loads(key), out, time.Since(start).Round(time.Millisecond))
}

// TestLoaderFailure checks errors and panics: every merged caller gets the
// failure (errors.Is works), the lock is released at once, nothing is cached,
// and the next caller elsewhere loads without waiting for a lease to expire.
func TestLoaderFailure(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	cases := []struct {
		name  string
		load  func(context.Context) (string, error)
		check func(error) bool
	}{
		{"error", func(context.Context) (string, error) { return "", fmt.Errorf("query: %w", errBoom) },
			func(err error) bool { return errors.Is(err, errBoom) }},
		{"panic-error", func(context.Context) (string, error) { panic(errBoom) },
			func(err error) bool {
				return errors.Is(err, errBoom) && strings.Contains(err.Error(), "loader panicked")
			}},
		{"panic-string", func(context.Context) (string, error) { panic("nil map write") },
			func(err error) bool {
				return err != nil && strings.Contains(err.Error(), "loader panicked: nil map write")
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := redistest.Prefix(t, direct) + "k"
			const lockTTL = 5 * time.Second
			opts := []cache.Option{cache.WithLockTTL(lockTTL), cache.WithRetry(100, 20*time.Millisecond)}
			cs := procs(t, 3, addr, nil, opts...)
			src := newSource(0)
			slowFail := func(ctx context.Context) (string, error) {
				src.loader(key, "")(ctx)
				time.Sleep(100 * time.Millisecond) // let every caller join a flight
				return tc.load(ctx)
			}
			start := time.Now()
			out := stampede(t, cs, 10, key, "", slowFail)
			took := time.Since(start)
			if out.ok != 0 {
				t.Errorf("callers: %v; want every caller to get the failure", out)
			}
			// Each process's flight loads at most once: a failure is not
			// cached, so a waiting process takes the freed lock and tries.
			if n := src.loads(key); n < 1 || n > 3 {
				t.Errorf("loads = %d; want 1..3", n)
			}
			if took > lockTTL {
				t.Errorf("stampede took %v; want well under the lock TTL %v (lock released at once)", took, lockTTL)
			}
			ctx := context.Background()
			if n := direct.Exists(ctx, key, lockKeyOf(key)).Val(); n != 0 {
				t.Errorf("EXISTS value, lock = %d; want 0: nothing cached, lock released", n)
			}
			_, err := cs[0].GetOrLoad(ctx, key, tc.load)
			if !tc.check(err) {
				t.Errorf("GetOrLoad error = %v; want the loader's failure", err)
			}
			// The next load anywhere starts at once.
			t0 := time.Now()
			v, err := cs[1].GetOrLoad(ctx, key, src.loader(key, "ok"))
			if err != nil || v != "ok" {
				t.Errorf("after failure: GetOrLoad = %q, %v; want %q", v, err, "ok")
			}
			t.Logf("figures: loader %s, 3 procs x 10 callers: loads=%d, %v, stampede %v, next load after %v",
				tc.name, src.loads(key)-1, out, took.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
		})
	}
}

// TestLoaderIgnoresContext gives the holder a loader that outlives its load
// timeout without looking at ctx. The holder's callers with their own
// deadline return at that deadline; at the load timeout the flight abandons
// the loader: its patient callers get the timeout error and the lock is
// released, so one other process loads. The abandoned loader's result is
// never written. Bound: one extra load per abandoned load.
func TestLoaderIgnoresContext(t *testing.T) {
	// Not parallel: leases and timeouts of a few hundred ms.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	key := redistest.Prefix(t, direct) + "k"
	const (
		lockTTL     = 300 * time.Millisecond
		loadTimeout = 200 * time.Millisecond
	)
	opts := []cache.Option{cache.WithLockTTL(lockTTL), cache.WithLoadTimeout(loadTimeout), cache.WithRetry(100, 20*time.Millisecond)}
	a := cache.New[string](newClient(t, addr, nil), opts...)
	b := cache.New[string](newClient(t, addr, nil), opts...)

	src := newSource(0)
	entered, ctxDone, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	stubborn := func(ctx context.Context) (string, error) {
		src.loader(key, "A")(ctx)
		go func() { <-ctx.Done(); close(ctxDone) }()
		close(entered)
		<-release // ignores ctx on purpose
		return "A", nil
	}
	waiter := make(chan string, 1)
	go func() {
		v, err := a.GetOrLoad(context.Background(), key, stubborn)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("holder's patient caller: %q, %v; want the load timeout's error", v, err)
		}
		waiter <- v
	}()
	<-entered

	// A caller with its own deadline is not held hostage by the loader.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	t0 := time.Now()
	_, err := a.GetOrLoad(ctx, key, stubborn)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > time.Second {
		t.Errorf("caller with 100ms deadline: %v after %v; want DeadlineExceeded promptly", err, time.Since(t0))
	}

	<-ctxDone
	lapse := eventually(t, 5*time.Second, "lock released after the load timeout", func() bool {
		return direct.Exists(context.Background(), lockKeyOf(key)).Val() == 0
	})
	v, err := b.GetOrLoad(context.Background(), key, src.loader(key, "B"))
	if err != nil || v != "B" {
		t.Errorf("other process: GetOrLoad = %q, %v; want its own %q", v, err, "B")
	}
	if v := <-waiter; v != "" {
		t.Errorf("holder's patient caller got %q; want nothing", v)
	}
	close(release)
	if n := src.loads(key); n != 2 {
		t.Errorf("loads = %d; want 2 (one extra after the lease lapsed)", n)
	}
	if got := stored(t, direct, key); got != `"B"` {
		t.Errorf("stored = %s; want %q: the late holder must not overwrite", got, `"B"`)
	}
	t.Logf("figures: loader ignoring ctx (load timeout %v, lock TTL %v): loads=%d, lock released %v after the flight deadline, stored %s",
		loadTimeout, lockTTL, src.loads(key), lapse.Round(time.Millisecond), stored(t, direct, key))
}
