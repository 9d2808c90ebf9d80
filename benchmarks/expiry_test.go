// This file measures what happens each time a hot key's TTL runs out
// under steady traffic: BenchmarkExpiry/<competitor>/inst=I/g=G, where one
// op is one expiry of the key.
package benchmarks

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// expiryTTL is 1s because go-redis/cache silently turns any shorter TTL
	// into an hour; every competitor gets the same.
	expiryTTL = time.Second
	// expiryThink is each goroutine's pause between reads: steady traffic
	// (up to 200 reads/s per goroutine) that leaves the two cores room for
	// Redis and the loads.
	expiryThink = 5 * time.Millisecond
	expiryWait  = 10 * expiryTTL // no expiry within this: the run is broken
)

var (
	expiryInstances  = []int{1, 4}
	expiryGoroutines = []int{16}
)

func BenchmarkExpiry(b *testing.B) {
	addr := privateRedis(b)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	runShapes(b, expiryInstances, expiryGoroutines, func(b *testing.B, c competitor, inst, g int) {
		if c.name == "stampede" {
			// Its early refresh (on by default) reloads the hot key before
			// it expires, so no expiry would ever come.
			b.Skip("stampede: no expiry with early refresh; see BenchmarkRefresh (refresh=off is this benchmark's case)")
		}
		benchExpiry(b, admin, addr, c, inst, g)
	})
}

func benchExpiry(b *testing.B, admin *redis.Client, addr string, c competitor, inst, g int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := "bench:expiry:" + c.name + ":" + nonce()

	// Redis publishes an "expired" keyspace event when it removes the key,
	// lazily on the first read after the deadline or by its active cycle:
	// that is the moment the stampede starts.
	sub := admin.Subscribe(ctx, "__keyspace@0__:"+key)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		b.Fatalf("subscribe: %v", err)
	}
	events := sub.Channel()
	nextExpiry := func() {
		t := time.NewTimer(expiryWait)
		defer t.Stop()
		for {
			select {
			case m := <-events:
				if m.Payload == "expired" {
					return
				}
			case <-t.C:
				b.Fatalf("%s: no expiry of %q within %v", c.name, key, expiryWait)
			}
		}
	}

	ins := make([]instance, inst)
	for i := range ins {
		in, err := c.open(addr, expiryTTL)
		if err != nil {
			b.Fatalf("open %s: %v", c.name, err)
		}
		defer in.Close()
		ins[i] = in
	}

	var loads, errs atomic.Int64
	var recording atomic.Bool
	load := loader(7, stampedeLoad, &loads)
	readers := startReaders(ctx, ins, g, key, load, &recording, &errs)
	defer readers.wait() // after cancel, which runs first
	defer cancel()

	// The first expiry is not measured: it only starts the window at the
	// moment a stampede begins. A load is counted when it completes, so
	// the loads completed between expiry 0 and expiry b.N are those of
	// b.N expiries.
	nextExpiry()
	l0 := loads.Load()
	recording.Store(true)
	b.ResetTimer()
	for range b.N {
		nextExpiry()
	}
	l1 := loads.Load()
	b.StopTimer()
	recording.Store(false)
	errsN := errs.Load()
	cancel()
	lat := readers.wait()

	b.ReportMetric(float64(l1-l0)/float64(b.N), "loads/expiry")
	b.ReportMetric(float64(errsN)/float64(b.N), "errors/op")
	reportLatency(b, lat)
	reportTail(b, lat)
}

// readers are the hot-key readers of BenchmarkExpiry and BenchmarkRefresh.
type readers struct {
	wg   sync.WaitGroup
	lats [][]time.Duration // one slice per reader: no lock on the hot path
}

// startReaders starts g readers per instance that read key until ctx ends,
// pausing expiryThink between reads. The latency of every read that starts
// while recording is set is kept, and errs counts those that failed or got
// a wrong value.
func startReaders[I instance](ctx context.Context, ins []I, g int, key string, load loadFunc, recording *atomic.Bool, errs *atomic.Int64) *readers {
	r := &readers{lats: make([][]time.Duration, len(ins)*g)}
	for k, in := range ins {
		for j := range g {
			r.wg.Go(func() {
				for ctx.Err() == nil {
					rec := recording.Load() // reads that start inside the window
					t0 := time.Now()
					rctx, rcancel := context.WithTimeout(ctx, stampedeTimeout)
					v, err := in.Get(rctx, key, load)
					rcancel()
					if rec {
						r.lats[k*g+j] = append(r.lats[k*g+j], time.Since(t0))
						if err != nil || v.ID != 7 {
							errs.Add(1)
						}
					}
					time.Sleep(expiryThink)
				}
			})
		}
	}
	return r
}

// wait waits for the readers to end (their ctx must have ended) and returns
// the latencies they kept, all together. It may be called more than once.
func (r *readers) wait() []time.Duration {
	r.wg.Wait()
	var lat []time.Duration
	for _, l := range r.lats {
		lat = append(lat, l...)
	}
	return lat
}
