// This file measures cache.GetOrLoadMany against the same keys asked
// for by one GetOrLoad call each, all in parallel:
// BenchmarkBatch/load=D/impl=many|parallel. One op is 100 keys of which 10
// are cold (deleted before the op, untimed); the other 90 are warm.
package benchmarks

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

const (
	batchKeys = 100
	batchCold = 10
)

// batchLoads are the loader latencies: 0 shows the cache's own cost, 20ms a
// database query (one query per loader call: a batch loader asks for all
// its keys in one).
var batchLoads = []time.Duration{0, stampedeLoad}

// roundTrips counts what a go-redis client sends: every Process call is one
// command and one round trip, every pipeline one round trip of several
// commands.
type roundTrips struct {
	single, pipelines, piped atomic.Int64
}

func (r *roundTrips) reset() {
	r.single.Store(0)
	r.pipelines.Store(0)
	r.piped.Store(0)
}

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.single.Add(1)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.pipelines.Add(1)
		r.piped.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func BenchmarkBatch(b *testing.B) {
	addr := privateRedis(b)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	for _, d := range batchLoads {
		b.Run("load="+d.String(), func(b *testing.B) {
			for _, impl := range []string{"many", "parallel"} {
				b.Run("impl="+impl, func(b *testing.B) { benchBatch(b, admin, addr, impl, d) })
			}
		})
	}
}

func benchBatch(b *testing.B, admin *redis.Client, addr, impl string, delay time.Duration) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var rt roundTrips
	rdb.AddHook(&rt)
	c := cache.New[Product](rdb, cache.WithTTL(time.Hour), cache.WithoutJitter(), cache.WithoutNearCache()) // it counts round trips
	defer c.Close()

	prefix := "bench:batch:" + nonce() + ":"
	keys := make([]string, batchKeys)
	ids := make(map[string]int64, batchKeys)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
		ids[keys[i]] = int64(i)
	}
	var loads, loaderCalls, bad atomic.Int64
	loadMany := func(ctx context.Context, ks []string) (map[string]Product, error) {
		loaderCalls.Add(1)
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		m := make(map[string]Product, len(ks))
		for _, k := range ks {
			m[k] = product(ids[k])
		}
		loads.Add(int64(len(ks)))
		return m, nil
	}
	single := make([]loadFunc, batchKeys)
	for i, k := range keys {
		single[i] = func(ctx context.Context) (Product, error) {
			loaderCalls.Add(1)
			return loader(ids[k], delay, &loads)(ctx)
		}
	}
	get := func() {
		switch impl {
		case "many":
			m, err := c.GetOrLoadMany(ctx, keys, loadMany)
			if err != nil || len(m) != batchKeys {
				bad.Add(1)
			}
			for k, v := range m {
				if v.ID != ids[k] {
					bad.Add(1)
				}
			}
		case "parallel":
			var wg sync.WaitGroup
			for i, k := range keys {
				wg.Go(func() {
					v, err := c.GetOrLoad(ctx, k, single[i])
					if err != nil || v.ID != ids[k] {
						bad.Add(1)
					}
				})
			}
			wg.Wait()
		}
	}
	// cold deletes the op's cold keys, untimed; the rest stay warm.
	cold := func() {
		if err := c.Delete(ctx, keys[:batchCold]...); err != nil {
			b.Fatalf("delete: %v", err)
		}
	}
	get() // warm all keys and the connection pool, and load the scripts
	get()

	var rts, cmds, redisCmds int64
	loads.Store(0)
	loaderCalls.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		cold()
		before := commandStats(b, admin)
		rt.reset()
		b.StartTimer()
		get()
		b.StopTimer()
		after := commandStats(b, admin)
		redisCmds += after.all - before.all
		// A pipeline's commands share one round trip.
		rts += rt.single.Load() + rt.pipelines.Load()
		cmds += rt.single.Load() + rt.piped.Load()
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(rts)/n, "round-trips/op")
	b.ReportMetric(float64(cmds)/n, "client-cmds/op")
	b.ReportMetric(float64(redisCmds)/n, "redis-cmds/op")
	b.ReportMetric(float64(loads.Load())/n, "loads/op")
	b.ReportMetric(float64(loaderCalls.Load())/n, "loader-calls/op")
	b.ReportMetric(float64(bad.Load())/n, "errors/op")
}
