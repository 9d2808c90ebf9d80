// This file measures stampede's own answers to expiry:
//
//   - BenchmarkRefresh/ttl=T/refresh=on|off/inst=I/g=G: a hot key under
//     steady traffic, with early refresh (XFetch, the default) and without
//     it. One op is one TTL of wall time; ttl=1h0m0s is a control in which
//     nothing expires (one op is then one second).
//   - BenchmarkStale/inst=I/g=G: the database fails for staleOutage while a
//     hot key's TTL runs out, with WithStale. One op is one outage.
//
// Only stampede has these features, so there are no competitors here; the
// refresh=off rows are the baseline in the same run.
package benchmarks

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
)

var (
	// refreshTTLs ends with a control: a TTL that never runs out during the
	// run, so its latency tail is the machine's and the hit path's alone.
	refreshTTLs       = []time.Duration{250 * time.Millisecond, time.Second, 2 * time.Second, time.Hour}
	refreshInstances  = []int{1, 4}
	refreshGoroutines = []int{16}
)

// refreshSlow is the latency above which a read counts as one that waited
// for a load: a hit is well under a millisecond, a load is 20 ms.
const refreshSlow = 10 * time.Millisecond

// refreshOp is how long one op of BenchmarkRefresh lasts: one TTL, or one
// second for the control TTL of an hour.
func refreshOp(ttl time.Duration) time.Duration {
	if ttl >= time.Hour {
		return time.Second
	}
	return ttl
}

// BenchmarkRefresh runs with -benchtime Nx (N TTLs per sample); the default
// benchtime gives one TTL per sample, which is too few to count loads.
// Metrics are per op, that is per TTL (per second for ttl=1h0m0s):
// loads/op (loader calls completed), loads/ttl and load-interval-ms (the
// same from the mean interval between completed loads, exact where the
// count in a few TTLs is not), misses/op (EventMiss: a read that
// found the value absent or expired, and so waited for a load), slow/op
// (reads over refreshSlow), and the latency of every read in the window.
func BenchmarkRefresh(b *testing.B) {
	addr := privateRedis(b)
	for _, ttl := range refreshTTLs {
		b.Run("ttl="+ttl.String(), func(b *testing.B) {
			for _, on := range []bool{true, false} {
				if ttl >= time.Hour && !on {
					continue // nothing expires: on and off are the same
				}
				name, beta := "refresh=on", cache.DefaultEarlyRefresh
				if !on {
					name, beta = "refresh=off", 0
				}
				b.Run(name, func(b *testing.B) {
					for _, inst := range refreshInstances {
						b.Run("inst="+strconv.Itoa(inst), func(b *testing.B) {
							for _, g := range refreshGoroutines {
								b.Run("g="+strconv.Itoa(g), func(b *testing.B) {
									benchRefresh(b, addr, ttl, beta, inst, g)
								})
							}
						})
					}
				})
			}
		})
	}
}

func benchRefresh(b *testing.B, addr string, ttl time.Duration, beta float64, inst, g int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := "bench:refresh:" + nonce()

	var misses atomic.Int64
	var recording atomic.Bool
	countMisses := cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventMiss && recording.Load() {
			misses.Add(1)
		}
	})
	ins := make([]*stampedeInst, inst)
	for i := range ins {
		in, err := openStampedeWith(addr, ttl, cache.WithEarlyRefresh(beta), countMisses)
		if err != nil {
			b.Fatalf("open stampede: %v", err)
		}
		defer in.Close()
		ins[i] = in
	}

	var loads, errs atomic.Int64
	// Completions of loads inside the window, timed: with few loads per
	// window the count alone is coarse (3 or 4 in 3 TTLs, depending on
	// where the window starts), the interval between them is not.
	var doneMu sync.Mutex
	var done []time.Time
	counted := loader(7, stampedeLoad, &loads)
	load := func(ctx context.Context) (Product, error) {
		v, err := counted(ctx)
		if err == nil && recording.Load() {
			doneMu.Lock()
			done = append(done, time.Now())
			doneMu.Unlock()
		}
		return v, err
	}
	readers := startReaders(ctx, ins, g, key, load, &recording, &errs)
	defer readers.wait() // after cancel, which runs first
	defer cancel()

	// One TTL of traffic before the window: the first load (a cold miss)
	// and the start-up of the readers are not what is measured.
	op := refreshOp(ttl)
	time.Sleep(op)
	l0 := loads.Load()
	recording.Store(true)
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * op)
	l1 := loads.Load()
	b.StopTimer()
	recording.Store(false)
	errsN := errs.Load()
	cancel()
	lat := readers.wait()
	slow := 0
	for _, d := range lat {
		if d > refreshSlow {
			slow++
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(l1-l0)/n, "loads/op")
	doneMu.Lock()
	if k := len(done); k >= 2 && ttl < time.Hour {
		// loads per TTL from the mean interval between completed loads:
		// 1 when each value is reloaded exactly once per TTL, more when
		// refreshes come early or twice.
		span := done[k-1].Sub(done[0])
		b.ReportMetric(float64(k-1)*float64(ttl)/float64(span), "loads/ttl")
		b.ReportMetric(float64(span)/float64(k-1)/float64(time.Millisecond), "load-interval-ms")
	}
	doneMu.Unlock()
	b.ReportMetric(float64(misses.Load())/n, "misses/op")
	b.ReportMetric(float64(slow)/n, "slow/op")
	b.ReportMetric(float64(len(lat))/n, "reads/op")
	b.ReportMetric(float64(errsN)/n, "errors/op")
	reportLatency(b, lat)
	reportTail(b, lat)
}

const (
	staleOutage   = 2 * time.Second        // how long the database fails
	staleTTL      = 200 * time.Millisecond // the value's TTL, shorter than the outage
	staleThrottle = 500 * time.Millisecond // WithStaleThrottle
	staleKeep     = time.Minute            // WithStale
	// staleRecoverCap bounds the wait for a fresh value once the database
	// is back: four throttles.
	staleRecoverCap = 4 * staleThrottle
)

var staleInstances = []int{1, 4}

// errDatabaseDown is what the loader returns during the outage.
var errDatabaseDown = errors.New("benchmarks: database down")

// BenchmarkStale: a hot key is loaded, then the database fails for
// staleOutage, during which the value's TTL (staleTTL) runs out. Every read
// that starts in the outage is counted:
//
//   - stale-%: of the reads that started after the TTL ended, those answered
//     with the old value marked stale (cache.WithResultInfo); the rest are
//     errors or waits for a load that cannot succeed.
//   - fresh-%: of all reads in the outage, those answered before the TTL
//     ended (still fresh).
//   - loads/throttle: loader calls (all failing) per staleThrottle of outage;
//     min-gap-ms is the shortest time between two of them.
//   - recovered/op, recover-max-ms: after the outage (untimed), whether a
//     read got a fresh value within staleRecoverCap, and the longest time
//     that took (staleRecoverCap when it did not).
//
// Use -benchtime 1x: one op takes staleOutage.
func BenchmarkStale(b *testing.B) {
	addr := privateRedis(b)
	for _, inst := range staleInstances {
		b.Run("inst="+strconv.Itoa(inst), func(b *testing.B) {
			b.Run("g=16", func(b *testing.B) { benchStale(b, addr, inst, 16) })
		})
	}
}

func benchStale(b *testing.B, addr string, inst, g int) {
	ins := make([]*stampedeInst, inst)
	for i := range ins {
		in, err := openStampedeWith(addr, staleTTL,
			cache.WithStale(staleKeep), cache.WithStaleThrottle(staleThrottle))
		if err != nil {
			b.Fatalf("open stampede: %v", err)
		}
		defer in.Close()
		ins[i] = in
	}

	// The database: a 20 ms query that fails while down is set. Every call
	// made while down is timed, to count and space the attempts.
	var down atomic.Bool
	var attemptsMu sync.Mutex
	var attempts []time.Time
	load := func(ctx context.Context) (Product, error) {
		if down.Load() {
			attemptsMu.Lock()
			attempts = append(attempts, time.Now())
			attemptsMu.Unlock()
		}
		t := time.NewTimer(stampedeLoad)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return Product{}, ctx.Err()
		}
		if down.Load() {
			return Product{}, errDatabaseDown
		}
		return product(7), nil
	}

	type read struct {
		start       time.Time
		ok, isStale bool
	}
	var total struct {
		reads, afterTTL, stale, fresh, errs, attempts, recovered int
		minGap, recoverMax                                       time.Duration
	}
	total.minGap = time.Hour

	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		key := "bench:stale:" + nonce() + ":" + strconv.Itoa(i)
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := ins[0].Get(wctx, key, load); err != nil {
			b.Fatalf("warm %q: %v", key, err)
		}
		wcancel()
		expired := time.Now().Add(staleTTL) // the record's TTL began before this
		attemptsMu.Lock()
		attempts = attempts[:0]
		attemptsMu.Unlock()
		down.Store(true)
		t0 := time.Now()
		end := t0.Add(staleOutage)
		b.StartTimer()

		reads := make([][]read, inst*g)
		var wg sync.WaitGroup
		for k, in := range ins {
			for j := range g {
				wg.Go(func() {
					for {
						start := time.Now()
						if !start.Before(end) {
							return
						}
						var info cache.ResultInfo
						rctx, rcancel := context.WithTimeout(context.Background(), stampedeTimeout)
						v, err := in.Get(cache.WithResultInfo(rctx, &info), key, load)
						rcancel()
						reads[k*g+j] = append(reads[k*g+j], read{start: start, ok: err == nil && v.ID == 7, isStale: info.Stale})
						time.Sleep(expiryThink)
					}
				})
			}
		}
		wg.Wait()
		b.StopTimer()
		down.Store(false)
		// Recovery (untimed): how long after the database is back until a
		// read gets a fresh value. A stale value's refresh may wait for the
		// throttle, so staleThrottle+load is the expected bound.
		back := time.Now()
		for {
			var info cache.ResultInfo
			rctx, rcancel := context.WithTimeout(context.Background(), stampedeTimeout)
			v, err := ins[0].Get(cache.WithResultInfo(rctx, &info), key, load)
			rcancel()
			if err == nil && v.ID == 7 && !info.Stale {
				total.recovered++
				total.recoverMax = max(total.recoverMax, time.Since(back))
				break
			}
			if time.Since(back) > staleRecoverCap {
				total.recoverMax = max(total.recoverMax, time.Since(back))
				break
			}
			time.Sleep(expiryThink)
		}

		for _, rs := range reads {
			for _, r := range rs {
				total.reads++
				switch {
				case !r.ok:
					total.errs++
				case !r.isStale:
					total.fresh++
				}
				if !r.start.Before(expired) {
					total.afterTTL++
					if r.ok && r.isStale {
						total.stale++
					}
				}
			}
		}
		attemptsMu.Lock()
		as := slices.Clone(attempts)
		attemptsMu.Unlock()
		for _, a := range as {
			if a.Before(end) {
				total.attempts++
			}
		}
		slices.SortFunc(as, func(x, y time.Time) int { return x.Compare(y) })
		for j := 1; j < len(as); j++ {
			total.minGap = min(total.minGap, as[j].Sub(as[j-1]))
		}
		b.StartTimer()
	}
	b.StopTimer()

	n := float64(b.N)
	pct := func(x, of int) float64 {
		if of == 0 {
			return 0
		}
		return 100 * float64(x) / float64(of)
	}
	b.ReportMetric(pct(total.stale, total.afterTTL), "stale-%")
	b.ReportMetric(pct(total.fresh, total.reads), "fresh-%")
	b.ReportMetric(float64(total.errs)/n, "errors/op")
	b.ReportMetric(float64(total.reads)/n, "reads/op")
	b.ReportMetric(float64(total.attempts)/n/float64(staleOutage/staleThrottle), "loads/throttle")
	b.ReportMetric(float64(total.recovered)/n, "recovered/op")
	b.ReportMetric(float64(total.recoverMax)/float64(time.Millisecond), "recover-max-ms")
	if total.minGap < time.Hour {
		b.ReportMetric(float64(total.minGap)/float64(time.Millisecond), "min-gap-ms")
	}
}
