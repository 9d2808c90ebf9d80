// This file asks for thousands of cold keys at once from several
// simulated processes: one load per key, and no goroutines or connections
// left behind afterwards.
package reliability_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestManyColdKeys(t *testing.T) {
	// Not parallel: it counts the goroutines of the whole test process.
	const (
		nkeys   = 3000
		nprocs  = 2
		workers = 16 // per process
		asks    = 4  // callers per key per process
	)
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	prefix := redistest.Prefix(t, direct)

	clients := make([]*redis.Client, nprocs)
	caches := make([]*cache.Cache[string], nprocs)
	for i := range clients {
		clients[i] = newClient(t, addr, nil)
		caches[i] = cache.New[string](clients[i], cache.WithRetry(500, 10*time.Millisecond))
		clients[i].Ping(context.Background()) // one warm connection, so the baseline has the reader
	}
	runtime.GC()
	baseG := runtime.NumGoroutine()

	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	src := newSource(time.Millisecond)
	round := func() (errs int, took time.Duration) {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		start := time.Now()
		for p := range nprocs {
			// Each process asks for every key asks times, in its own order,
			// so keys are hit concurrently across and within processes.
			jobs := make([]int, 0, nkeys*asks)
			for range asks {
				for i := range nkeys {
					jobs = append(jobs, i)
				}
			}
			rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
			ch := make(chan int)
			for range workers {
				wg.Go(func() {
					for i := range ch {
						v, err := caches[p].GetOrLoad(context.Background(), keys[i], src.loader(keys[i], keys[i]))
						if err != nil || v != keys[i] {
							mu.Lock()
							errs++
							if errs < 5 {
								t.Errorf("GetOrLoad(%q) = %q, %v", keys[i], v, err)
							}
							mu.Unlock()
						}
					}
				})
			}
			wg.Go(func() {
				for _, i := range jobs {
					ch <- i
				}
				close(ch)
			})
		}
		wg.Wait()
		return errs, time.Since(start)
	}

	errs1, took1 := round()
	pool1 := make([]redis.PoolStats, nprocs)
	for i, c := range clients {
		pool1[i] = *c.PoolStats()
	}
	var multi int
	for _, k := range keys {
		if n := src.loads(k); n != 1 {
			multi++
			if multi < 5 {
				t.Errorf("loads(%q) = %d; want 1", k, n)
			}
		}
	}
	// A warm second round must be all hits and need no new connections.
	errs2, took2 := round()
	if total := src.total.Load(); total != nkeys {
		t.Errorf("total loads after the warm round = %d; want %d", total, nkeys)
	}
	for i, c := range clients {
		s := c.PoolStats()
		if s.TotalConns > pool1[i].TotalConns || s.TotalConns > uint32(c.Options().PoolSize) {
			t.Errorf("proc %d: connections %d after the warm round, %d after the cold one (pool size %d); want no growth",
				i, s.TotalConns, pool1[i].TotalConns, c.Options().PoolSize)
		}
		if s.Timeouts != 0 {
			t.Errorf("proc %d: %d pool timeouts", i, s.Timeouts)
		}
	}
	// Every goroutine the library started has ended (the watchdogs, the
	// flights, and with Close the notifier's subscriptions); only the pools'
	// own readers may remain, bounded by the pool.
	for i, c := range caches {
		if err := c.Close(); err != nil {
			t.Errorf("proc %d: Close: %v", i, err)
		}
	}
	var g int
	settle := eventually(t, 10*time.Second, "goroutines back to baseline", func() bool {
		runtime.GC()
		g = runtime.NumGoroutine()
		return g <= baseG
	})
	t.Logf("figures: %d cold keys x %d procs x %d asks (%d calls/round): loads=%d (keys loaded more than once: %d), errors=%d/%d, cold round %v, warm round %v, conns per proc %d/%d (pool %d), goroutines %d -> %d (settled in %v)",
		nkeys, nprocs, asks, nkeys*nprocs*asks, src.total.Load(), multi, errs1, errs2, took1.Round(time.Millisecond), took2.Round(time.Millisecond),
		pool1[0].TotalConns, pool1[1].TotalConns, clients[0].Options().PoolSize, baseG, g, settle.Round(time.Millisecond))
}
