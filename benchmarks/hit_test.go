// This file measures the path every request takes once a key is cached:
// BenchmarkHit/impl=<competitor>/ctx=<background|cancellable>/keys=<hot|spread10k>.
// The parts are key=value so that benchstat can put competitors side by side
// (-col /impl) and compare the two contexts (-col /ctx).
package benchmarks

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	hitSpread = 10_000
	// hitParallelism goroutines per GOMAXPROCS: more callers than cores, as
	// in a server, so that merging concurrent reads of one key can show.
	hitParallelism = 8
)

func BenchmarkHit(b *testing.B) {
	addr := privateRedis(b)
	for _, c := range competitors {
		b.Run("impl="+c.name, func(b *testing.B) {
			in, err := c.open(addr, time.Hour)
			if err != nil {
				b.Fatalf("open %s: %v", c.name, err)
			}
			defer in.Close()

			prefix := "bench:hit:" + c.name + ":" + nonce() + ":"
			hot := prefix + "hot"
			keys := make([]string, hitSpread)
			for i := range keys {
				keys[i] = prefix + strconv.Itoa(i)
			}
			warm(b, in, hot, 0)
			warmAll(b, in, keys)

			for _, cc := range hitContexts {
				b.Run("ctx="+cc.name, func(b *testing.B) {
					b.Run("keys=hot", func(b *testing.B) {
						benchHits(b, in, cc.ctx, func(int) (string, int64) { return hot, 0 })
					})
					b.Run("keys=spread10k", func(b *testing.B) {
						benchHits(b, in, cc.ctx, func(i int) (string, int64) {
							i %= hitSpread
							return keys[i], int64(i)
						})
					})
				})
			}
		})
	}
}

// hitContexts are the contexts a hit is measured with. A Background context
// can never end, so a cache may run its flight inline; a cancellable one
// (a request's context, say) obliges a cache that promises to return when
// the caller's context ends to watch it while Redis answers.
var hitContexts = []struct {
	name string
	ctx  func() (context.Context, context.CancelFunc)
}{
	{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
	{"cancellable", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
}

// benchHits reads warm keys in parallel; key(i) names the i-th read's key
// and the ID its value must have. A load or a wrong value fails the run:
// it would no longer be a hit benchmark.
func benchHits(b *testing.B, in instance, newCtx func() (context.Context, context.CancelFunc), key func(i int) (string, int64)) {
	var loads, bad atomic.Int64
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(hitParallelism)
	b.ResetTimer()
	cpu0, cpuOK := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine walks the keys from its own start, so goroutines do
		// not read the same key in lockstep.
		i := int(seq.Add(1)) * 7919
		// One context per goroutine, made before the loop, like a request's
		// context shared by the reads it makes.
		ctx, cancel := newCtx()
		defer cancel()
		for pb.Next() {
			k, id := key(i)
			i++
			v, err := in.Get(ctx, k, loader(id, 0, &loads))
			if err != nil || v.ID != id {
				bad.Add(1)
			}
		}
	})
	cpu1, _ := processCPU()
	b.StopTimer()
	if cpuOK {
		// The client's CPU per hit: on a machine shared with other work,
		// wall time per op swings with their load, CPU time much less.
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
	if n, m := loads.Load(), bad.Load(); n != 0 || m != 0 {
		b.Fatalf("%d loads and %d errors or wrong values during a hit benchmark", n, m)
	}
}

// warm stores product(id) at key through the instance's own write path, so
// the bytes are in its own format.
func warm(tb testing.TB, in instance, key string, id int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s, ok := in.(seeder); ok {
		if err := s.seed(ctx, key, product(id)); err != nil {
			tb.Fatalf("seed %q: %v", key, err)
		}
	}
	var loads atomic.Int64
	if _, err := in.Get(ctx, key, loader(id, 0, &loads)); err != nil {
		tb.Fatalf("warm %q: %v", key, err)
	}
}

// warmAll warms keys[i] with product(i), a few at a time.
func warmAll(tb testing.TB, in instance, keys []string) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				warm(tb, in, keys[i], int64(i))
			}
		})
	}
	for i := range keys {
		next <- i
	}
	close(next)
	wg.Wait()
}
