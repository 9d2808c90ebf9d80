// This file runs early refresh and stale-if-error on a real
// 3-master Redis Cluster, read continuously by several simulated processes
// (one ClusterClient and one Cache each): keys in slots of every master,
// loads and events counted per key.
package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// keysOnEveryMaster returns perMaster keys (without the prefix p) in the
// slots of each of masters masters (startCluster splits the slots evenly).
func keysOnEveryMaster(p string, masters, perMaster int) []string {
	var keys []string
	found := make([]int, masters)
	for i := 0; len(keys) < masters*perMaster; i++ {
		k := "k" + strconv.Itoa(i)
		if m := int(slot(p+k)) * masters / 16384; found[m] < perMaster {
			found[m]++
			keys = append(keys, k)
		}
	}
	return keys
}

// eventTally counts caches' events by kind, and misses by key (without
// the prefix).
type eventTally struct {
	prefix string
	kinds  [cache.EventBreakerClose + 1]atomic.Int64
	mu     sync.Mutex // protects misses
	misses map[string]int
}

func newEventTally(prefix string) *eventTally {
	return &eventTally{prefix: prefix, misses: map[string]int{}}
}

func (e *eventTally) observe(ev cache.Event) {
	if int(ev.Kind) < len(e.kinds) {
		e.kinds[ev.Kind].Add(1)
	}
	if ev.Kind == cache.EventMiss {
		e.mu.Lock()
		e.misses[strings.TrimPrefix(ev.Key, e.prefix)]++
		e.mu.Unlock()
	}
}

func (e *eventTally) n(kind cache.EventKind) int64 { return e.kinds[kind].Load() }

func (e *eventTally) missesByKey() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := make(map[string]int, len(e.misses))
	for k, n := range e.misses {
		m[k] = n
	}
	return m
}

// refreshed is the value of TestClusterEarlyRefreshAcrossInstances: which
// load of which key it came from.
type refreshed struct {
	Key     string
	Version int64
}

// TestClusterEarlyRefreshAcrossInstances proves early refresh on a cluster:
// 4 processes read keys on every master continuously for 3.5 TTLs. After the
// cold start no read meets a miss, every key gets a new value each TTL (no
// reader ever goes back to an older one), and each key is loaded about once
// per TTL across all the processes, not once per process.
func TestClusterEarlyRefreshAcrossInstances(t *testing.T) {
	// Not parallel: a refresh made late by a busy machine is a miss here.
	const (
		masters, perMaster, procs = 3, 2, 4
		ttl                       = time.Second
		loadTime                  = 50 * time.Millisecond
		periods                   = 3 // whole TTLs the readers run for
		run                       = periods*ttl + ttl/2
		pace                      = 10 * time.Millisecond // between a reader's reads
	)
	cl := startCluster(t, masters)
	ctx := t.Context()
	admin := cl.client(t)
	p := redistest.Prefix(t, admin)
	keys := keysOnEveryMaster(p, masters, perMaster)

	loads := map[string]*atomic.Int64{}
	for _, k := range keys {
		loads[k] = new(atomic.Int64)
	}
	loader := func(k string) func(context.Context) (refreshed, error) {
		return func(ctx context.Context) (refreshed, error) {
			v := refreshed{Key: k, Version: loads[k].Add(1)}
			select {
			case <-time.After(loadTime):
				return v, nil
			case <-ctx.Done():
				return refreshed{}, ctx.Err()
			}
		}
	}
	ev := newEventTally(p)
	cs := make([]*cache.Cache[refreshed], procs)
	for i := range cs { // early refresh is on by default
		cs[i] = cache.New[refreshed](cl.client(t), cache.WithPrefix(p), cache.WithTTL(ttl), cache.WithoutJitter(),
			cache.WithObserver(ev.observe))
		t.Cleanup(func() { _ = cs[i].Close() })
	}

	// Cold start: one process loads every key.
	for _, k := range keys {
		if v, err := cs[0].GetOrLoad(ctx, k, loader(k)); err != nil || v != (refreshed{k, 1}) {
			t.Fatalf("cold GetOrLoad(%q) = %+v, %v; want version 1", k, v, err)
		}
	}
	coldMisses := ev.n(cache.EventMiss)

	var (
		wg      sync.WaitGroup
		out     outcome
		reads   atomic.Int64
		mu      sync.Mutex // protects seen
		seen    = map[string]map[int64]bool{}
		badRead atomic.Value // the first wrong read, if any
	)
	for _, k := range keys {
		seen[k] = map[int64]bool{}
	}
	deadline := time.Now().Add(run)
	for i, c := range cs {
		for _, k := range keys {
			wg.Go(func() {
				var last int64
				for time.Now().Before(deadline) {
					v, err := c.GetOrLoad(ctx, k, loader(k))
					reads.Add(1)
					out.add(err)
					if err == nil {
						if v.Key != k || v.Version < last {
							badRead.CompareAndSwap(nil, fmt.Sprintf("process %d read %q = %+v after version %d", i, k, v, last))
						}
						last = max(last, v.Version)
						mu.Lock()
						seen[k][v.Version] = true
						mu.Unlock()
					}
					time.Sleep(pace)
				}
			})
		}
	}
	wg.Wait()
	for _, c := range cs {
		_ = c.Close() // waits for the refreshes still running
	}

	if out.ok != int(reads.Load()) {
		t.Errorf("reads: %v of %d; want all ok", &out, reads.Load())
	}
	if bad := badRead.Load(); bad != nil {
		t.Errorf("%s; want the key's own value, never older than one already read", bad)
	}
	if n := ev.n(cache.EventMiss) - coldMisses; n != 0 {
		t.Errorf("misses after the cold start = %d (%v); want 0: a hot key is refreshed before callers see it expire",
			n, ev.missesByKey())
	}
	maxLoads := int64(1 + periods + 1) // the cold load, one per TTL, one of slack
	perKey := make([]int64, len(keys))
	for i, k := range keys {
		n := loads[k].Load()
		perKey[i] = n
		if n > maxLoads {
			t.Errorf("loads of %q = %d in %v with TTL %v across %d processes; want at most %d (about one per TTL)",
				k, n, run, ttl, procs, maxLoads)
		}
		mu.Lock()
		versions := len(seen[k])
		mu.Unlock()
		if versions < 1+periods {
			t.Errorf("%q: readers saw %d versions in %v with TTL %v; want at least %d (a new value every TTL)",
				k, versions, run, ttl, 1+periods)
		}
	}
	if n, want := ev.n(cache.EventRefresh), ev.n(cache.EventLoad)-int64(len(keys)); n != want {
		t.Errorf("EventRefresh = %d; want %d: every load after the cold ones must be a background refresh", n, want)
	}
	t.Logf("figures: 3-master cluster, %d keys (%d per master), %d processes reading each every %v for %v, TTL %v, load %v: "+
		"reads=%d, misses after cold start=%d, loads per key %v (bound %d), refreshes=%d, lock lost=%d",
		len(keys), perMaster, procs, pace, run, ttl, loadTime, reads.Load(), ev.n(cache.EventMiss)-coldMisses,
		perKey, maxLoads, ev.n(cache.EventRefresh), ev.n(cache.EventLockLost))
}

// TestClusterStaleIfErrorAcrossInstances proves stale-if-error on a cluster:
// once the loader fails and the TTL has passed, every read of keys on every
// master, from 4 processes, gets the old value marked stale and meets no
// miss; the failing loader is called at most once per stale throttle per key
// across all the processes; and once it recovers, every reader gets the
// fresh value, not stale, and never the old one again.
func TestClusterStaleIfErrorAcrossInstances(t *testing.T) {
	t.Parallel()
	const (
		masters, perMaster, procs = 3, 2, 4
		ttl                       = 300 * time.Millisecond
		throttle                  = 450 * time.Millisecond
		failFor                   = 2 * time.Second // readers meet the failing loader this long
		loadTime                  = 20 * time.Millisecond
		pace                      = 10 * time.Millisecond
	)
	cl := startCluster(t, masters)
	ctx := t.Context()
	admin := cl.client(t)
	p := redistest.Prefix(t, admin)
	keys := keysOnEveryMaster(p, masters, perMaster)

	var failing, recovered atomic.Bool
	failedCalls := map[string]*atomic.Int64{}
	for _, k := range keys {
		failedCalls[k] = new(atomic.Int64)
	}
	errDown := errors.New("database down")
	old, fresh := func(k string) string { return "old:" + k }, func(k string) string { return "fresh:" + k }
	loader := func(k string) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			down, ok := failing.Load(), recovered.Load()
			if down {
				failedCalls[k].Add(1)
			}
			select {
			case <-time.After(loadTime):
			case <-ctx.Done():
				return "", ctx.Err()
			}
			switch {
			case down:
				return "", errDown
			case ok:
				return fresh(k), nil
			}
			return old(k), nil
		}
	}
	ev := newEventTally(p)
	cs := make([]*cache.Cache[string], procs)
	for i := range cs {
		cs[i] = cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithTTL(ttl), cache.WithoutJitter(),
			cache.WithStale(time.Minute), cache.WithStaleThrottle(throttle), cache.WithObserver(ev.observe))
		t.Cleanup(func() { _ = cs[i].Close() })
	}

	for _, k := range keys {
		if v, err := cs[0].GetOrLoad(ctx, k, loader(k)); err != nil || v != old(k) {
			t.Fatalf("cold GetOrLoad(%q) = %q, %v; want %q", k, v, err, old(k))
		}
	}
	coldMisses := ev.n(cache.EventMiss)
	failing.Store(true)
	time.Sleep(ttl + 50*time.Millisecond) // no reads meanwhile: no early refresh, every value past its TTL

	var (
		wg       sync.WaitGroup
		out      outcome
		reads    atomic.Int64
		downRead atomic.Int64 // reads that ended before the loader recovered
		marked   atomic.Int64 // those of them marked stale
		badRead  atomic.Value // the first wrong read, if any
		gotFresh = make([]atomic.Bool, procs*len(keys))
		stop     atomic.Bool
	)
	bad := func(format string, args ...any) { badRead.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
	for i, c := range cs {
		for j, k := range keys {
			wg.Go(func() {
				for !stop.Load() {
					var info cache.ResultInfo
					v, err := c.GetOrLoad(cache.WithResultInfo(ctx, &info), k, loader(k))
					up := !failing.Load() // after the call: false means the whole call met the failing loader
					reads.Add(1)
					out.add(err)
					switch {
					case err != nil:
					case !up:
						downRead.Add(1)
						if info.Stale {
							marked.Add(1)
						}
						if v != old(k) || !info.Stale {
							bad("process %d, loader failing: %q = %q, stale %v; want %q, stale", i, k, v, info.Stale, old(k))
						}
					case v == fresh(k): // stale too if a later refresh commits past the new TTL
						if !info.Stale {
							gotFresh[i*len(keys)+j].Store(true)
						}
					case v == old(k) && info.Stale:
						if gotFresh[i*len(keys)+j].Load() {
							bad("process %d: %q = %q, stale, after the fresh value", i, k, v)
						}
					default:
						bad("process %d, loader recovered: %q = %q, stale %v; want %q (stale) or %q",
							i, k, v, info.Stale, old(k), fresh(k))
					}
					time.Sleep(pace)
				}
			})
		}
	}
	defer func() { stop.Store(true); wg.Wait() }() // also when a check below ends the test
	time.Sleep(failFor)
	staleServed := ev.n(cache.EventStaleServed)
	recovered.Store(true)
	failing.Store(false)
	took := eventually(t, 10*time.Second, "every process reads every key fresh", func() bool {
		for i := range gotFresh {
			if !gotFresh[i].Load() {
				return false
			}
		}
		return true
	})
	stop.Store(true)
	wg.Wait()
	for _, c := range cs {
		_ = c.Close()
	}

	if out.ok != int(reads.Load()) {
		t.Errorf("reads: %v of %d; want all ok (the stale value served)", &out, reads.Load())
	}
	if b := badRead.Load(); b != nil {
		t.Error(b)
	}
	if downRead.Load() == 0 {
		t.Errorf("no read met the failing loader")
	}
	if n := ev.n(cache.EventMiss) - coldMisses; n != 0 {
		t.Errorf("misses after the cold start = %d (%v); want 0: a value past its TTL is served stale", n, ev.missesByKey())
	}
	// Calls are at least a throttle apart: each failure stores the stale
	// value marked for the throttle, before which no process retries.
	maxCalls := int64(failFor/throttle) + 1 + 1 // + 1 of slack
	calls := make([]int64, len(keys))
	for i, k := range keys {
		calls[i] = failedCalls[k].Load()
		if calls[i] < 1 || calls[i] > maxCalls {
			t.Errorf("failing loader calls for %q = %d in %v with throttle %v across %d processes; want 1 to %d",
				k, calls[i], failFor, throttle, procs, maxCalls)
		}
	}
	t.Logf("figures: 3-master cluster, %d keys (%d per master), %d processes reading each every %v, TTL %v, throttle %v: "+
		"%d reads while the loader failed for %v, %d of them marked stale (EventStaleServed %d), failing calls per key %v (bound %d), "+
		"fresh everywhere %v after recovery, misses after cold start=%d",
		len(keys), perMaster, procs, pace, ttl, throttle, downRead.Load(), failFor, marked.Load(), staleServed, calls, maxCalls,
		took.Round(time.Millisecond), ev.n(cache.EventMiss)-coldMisses)
}
