// hit_concurrent_test.go measures hits under concurrency, where read
// coalescing shows: BenchmarkHitConcurrent/impl=<competitor>/g=<goroutines>,
// g goroutines of one process reading 10,000 warm keys spread over the key
// space, with Background contexts. Besides ns/op (per hit) it reports the
// private Redis's CPU per hit (redis-cpu-ns/op, from INFO cpu) and the
// client's (cpu-ns/op).
package benchmarks

import (
	"bufio"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// hitConcurrentImpls are raw GETs, stampede (near cache off, its default),
// rueidisaside without client-side caching (rueidis pipelines every
// command automatically), and raw GETs through go-redis's experimental
// AutoPipeline (v9.22+), which coalescing could have been built on.
var hitConcurrentImpls = []string{"raw", "raw-autopipeline", "stampede", "rueidisaside-nocsc"}

func BenchmarkHitConcurrent(b *testing.B) {
	addr := privateRedis(b)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	for _, name := range hitConcurrentImpls {
		b.Run("impl="+name, func(b *testing.B) {
			in, err := openHitConcurrent(name, addr)
			if err != nil {
				b.Fatalf("open %s: %v", name, err)
			}
			defer in.Close()
			prefix := "bench:hitc:" + name + ":" + nonce() + ":"
			keys := make([]string, hitSpread)
			for i := range keys {
				keys[i] = prefix + strconv.Itoa(i)
			}
			warmAll(b, in, keys)
			for _, g := range []int{1, 8, 64, 256} {
				b.Run("g="+strconv.Itoa(g), func(b *testing.B) { benchHitsG(b, admin, in, keys, g) })
			}
		})
	}
}

func openHitConcurrent(name, addr string) (instance, error) {
	if name == "raw-autopipeline" {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		ap, err := rdb.AutoPipeline()
		if err != nil {
			_ = rdb.Close()
			return nil, err
		}
		return &autoPipeInst{rawInst: rawInst{rdb: rdb, ttl: time.Hour}, ap: ap}, nil
	}
	for _, c := range competitors {
		if c.name == name {
			return c.open(addr, time.Hour)
		}
	}
	panic("benchmarks: no competitor " + name)
}

// autoPipeInst is raw with its GETs sent through an AutoPipeliner.
type autoPipeInst struct {
	rawInst
	ap *redis.AutoPipeliner
}

func (a *autoPipeInst) Get(ctx context.Context, key string, _ loadFunc) (Product, error) {
	var v Product
	b, err := a.ap.Get(ctx, key).Bytes()
	if err != nil {
		return v, err
	}
	err = json.Unmarshal(b, &v)
	return v, err
}

func (a *autoPipeInst) Close() {
	_ = a.ap.Close()
	a.rawInst.Close()
}

// benchHitsG runs b.N hits on g goroutines, each walking the keys from its
// own start.
func benchHitsG(b *testing.B, admin *redis.Client, in instance, keys []string, g int) {
	var loads, bad, n atomic.Int64
	b.ReportAllocs()
	cpu0, cpuOK := processCPU()
	rcpu0 := redisCPU(b, admin)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range g {
		wg.Go(func() {
			ctx := context.Background()
			i := w * 7919
			for n.Add(1) <= int64(b.N) {
				k := i % len(keys)
				i++
				v, err := in.Get(ctx, keys[k], loader(int64(k), 0, &loads))
				if err != nil || v.ID != int64(k) {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	cpu1, _ := processCPU()
	b.ReportMetric(float64(redisCPU(b, admin)-rcpu0)/float64(b.N), "redis-cpu-ns/op")
	if cpuOK {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
	if l, m := loads.Load(), bad.Load(); l != 0 || m != 0 {
		b.Fatalf("%d loads and %d errors or wrong values during a hit benchmark", l, m)
	}
}

// redisCPU is the CPU time (user + system, all threads) the private Redis
// has used, from INFO cpu.
func redisCPU(tb testing.TB, admin *redis.Client) time.Duration {
	tb.Helper()
	txt, err := admin.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatalf("INFO cpu: %v", err)
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err == nil {
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}
