// This file measures a cold-key stampede: BenchmarkStampede/
// <competitor>/inst=I/g=G, where one op is one fresh key asked for at the
// same moment by I instances times G goroutines.
package benchmarks

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	stampedeLoad    = 20 * time.Millisecond // the database query's latency
	stampedeTTL     = time.Minute
	stampedeTimeout = 30 * time.Second // a caller that waits longer counts as an error
)

var (
	stampedeInstances  = []int{1, 4}
	stampedeGoroutines = []int{16, 64}
)

func BenchmarkStampede(b *testing.B) {
	addr := privateRedis(b)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	runShapes(b, stampedeInstances, stampedeGoroutines, func(b *testing.B, c competitor, inst, g int) {
		benchStampede(b, admin, addr, c, inst, g)
	})
}

func benchStampede(b *testing.B, admin *redis.Client, addr string, c competitor, inst, g int) {
	ins := make([]instance, inst)
	for i := range ins {
		in, err := c.open(addr, stampedeTTL)
		if err != nil {
			b.Fatalf("open %s: %v", c.name, err)
		}
		defer in.Close()
		ins[i] = in
	}
	prefix := "bench:stampede:" + c.name + ":" + nonce() + ":"
	var loads, errs atomic.Int64

	// One untimed stampede fills the connection pools, so that connection
	// set-up (HELLO, CLIENT SETINFO, CLIENT TRACKING) is not counted as the
	// cost of a stampede.
	stampede(ins, g, prefix+"warmup", -1, &loads, &errs)

	loads.Store(0)
	errs.Store(0)
	lat := make([]time.Duration, 0, b.N*inst*g)
	before := commandStats(b, admin)
	b.ResetTimer()
	for i := range b.N {
		lat = append(lat, stampede(ins, g, prefix+strconv.Itoa(i), int64(i), &loads, &errs)...)
	}
	b.StopTimer()
	after := commandStats(b, admin)

	n := float64(b.N)
	b.ReportMetric(float64(loads.Load())/n, "loads/op")
	b.ReportMetric(float64(after.all-before.all)/n, "redis-cmds/op")
	b.ReportMetric(float64(after.scripts-before.scripts)/n, "redis-scripts/op")
	b.ReportMetric(float64(errs.Load())/n, "errors/op")
	reportLatency(b, lat)
}

// stampede releases len(ins)*g callers of key at once and returns each
// caller's latency. Errors, timeouts and wrong values are counted in errs.
func stampede(ins []instance, g int, key string, id int64, loads, errs *atomic.Int64) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), stampedeTimeout)
	defer cancel()
	load := loader(id, stampedeLoad, loads)
	lat := make([]time.Duration, len(ins)*g)
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for k, in := range ins {
		for j := range g {
			ready.Add(1)
			done.Go(func() {
				ready.Done()
				<-start
				t0 := time.Now()
				v, err := in.Get(ctx, key, load)
				lat[k*g+j] = time.Since(t0)
				if err != nil || v.ID != id {
					errs.Add(1)
				}
			})
		}
	}
	ready.Wait() // every caller is parked on start: they go together
	close(start)
	done.Wait()
	return lat
}
