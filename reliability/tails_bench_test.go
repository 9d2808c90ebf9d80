// This file measures read tails when the readers alone saturate
// the cores: 64 goroutines per core reading 1,000 keys
// without pause, a second client writing 100 keys a second, near cache on
// or off.
package reliability_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// go test -run '^$' -bench BenchmarkSaturatedReads -benchtime 5000x ./reliability/   (one op: 1 ms of the run)
func BenchmarkSaturatedReads(b *testing.B) {
	for _, near := range []string{"off", "strict"} {
		b.Run("near="+near, func(b *testing.B) { benchSaturated(b, near) })
	}
}

func benchSaturated(b *testing.B, near string) {
	addr := redistest.Addr(b)
	direct := newClient(b, addr, nil)
	p := redistest.Prefix(b, direct)
	var drops atomic.Int64
	r := cache.New[string](newClient(b, addr, nil), nearOption(near, cache.WithPrefix(p), cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearDrop {
			drops.Add(1)
		}
	}))...)
	defer r.Close()
	w := cache.New[string](newClient(b, addr, nil), nearOption(near, cache.WithPrefix(p))...)
	defer w.Close()
	ctx := context.Background()
	const keys = 1000
	for i := range keys {
		if err := w.Set(ctx, fmt.Sprint("k", i), "v"); err != nil {
			b.Fatal(err)
		}
	}
	load := func(context.Context) (string, error) { return "loaded", nil }
	run := time.Duration(b.N) * time.Millisecond // -benchtime 5000x: 5 s
	var stop atomic.Bool
	var wg sync.WaitGroup
	lat := make([][]time.Duration, 64*runtime.GOMAXPROCS(0))
	for g := range lat {
		wg.Go(func() {
			for !stop.Load() {
				t0 := time.Now()
				_, _ = r.GetOrLoad(ctx, fmt.Sprint("k", rand.IntN(keys)), load)
				lat[g] = append(lat[g], time.Since(t0))
			}
		})
	}
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			_ = w.Set(ctx, fmt.Sprint("k", i%keys), fmt.Sprint("v", i))
			time.Sleep(10 * time.Millisecond)
		}
	})
	b.ResetTimer()
	time.Sleep(run)
	stop.Store(true)
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	q := func(f float64) float64 { return float64(all[int(f*float64(len(all)-1))]) / 1e6 }
	b.ReportMetric(float64(len(all))/run.Seconds(), "reads/s")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.999), "p999-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(float64(drops.Load()), "near-drops")
}
