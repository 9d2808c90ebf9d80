// This file measures hits under concurrency, where read
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

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
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
				b.Run("g="+strconv.Itoa(g), func(b *testing.B) { benchHitsG(b, []*redis.Client{admin}, in, keys, g) })
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
func benchHitsG(b *testing.B, admins []*redis.Client, in instance, keys []string, g int) {
	var loads, bad, n atomic.Int64
	b.ReportAllocs()
	cpu0, cpuOK := processCPU()
	rcpu0 := redisCPU(b, admins...)
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
	b.ReportMetric(float64(redisCPU(b, admins...)-rcpu0)/float64(b.N), "redis-cpu-ns/op")
	if cpuOK {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
	if l, m := loads.Load(), bad.Load(); l != 0 || m != 0 {
		b.Fatalf("%d loads and %d errors or wrong values during a hit benchmark", l, m)
	}
}

// BenchmarkHitConcurrentCluster is BenchmarkHitConcurrent on a private
// 3-master Redis Cluster (no target; a report): raw ClusterClient GETs,
// stampede on the same kind of client (an MGET per slot, a pipeline per
// master), rueidisaside without client-side caching. redis-cpu-ns/op sums
// the three masters.
func BenchmarkHitConcurrentCluster(b *testing.B) {
	addrs, admins := startBenchCluster(b, 3)
	for _, name := range []string{"raw", "stampede", "rueidisaside-nocsc"} {
		b.Run("impl="+name, func(b *testing.B) {
			var in instance
			switch name {
			case "raw":
				in = &rawClusterInst{rdb: redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})}
			case "stampede":
				rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
				in = &stampedeClusterInst{rdb: rdb, c: cache.New[Product](rdb, cache.WithTTL(time.Hour), cache.WithoutJitter(), cache.WithoutNearCache())}
			default:
				var err error
				if in, err = openRueidisAside(false)(addrs[0], time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			defer in.Close()
			prefix := "bench:hitcc:" + name + ":" + nonce() + ":"
			keys := make([]string, hitSpread)
			for i := range keys {
				keys[i] = prefix + strconv.Itoa(i)
			}
			warmAll(b, in, keys)
			for _, g := range []int{1, 8, 64, 256} {
				b.Run("g="+strconv.Itoa(g), func(b *testing.B) { benchHitsG(b, admins, in, keys, g) })
			}
		})
	}
}

// rawClusterInst is raw on a ClusterClient.
type rawClusterInst struct{ rdb *redis.ClusterClient }

func (r *rawClusterInst) Get(ctx context.Context, key string, _ loadFunc) (Product, error) {
	var v Product
	b, err := r.rdb.Get(ctx, key).Bytes()
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(b, &v)
}

func (r *rawClusterInst) seed(ctx context.Context, key string, v Product) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return r.rdb.Set(ctx, key, b, time.Hour).Err()
}

func (r *rawClusterInst) Close() { _ = r.rdb.Close() }

type stampedeClusterInst struct {
	rdb *redis.ClusterClient
	c   *cache.Cache[Product]
}

func (s *stampedeClusterInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	return s.c.GetOrLoad(ctx, key, load)
}

func (s *stampedeClusterInst) Close() {
	_ = s.c.Close()
	_ = s.rdb.Close()
}

// startBenchCluster starts masters private cluster nodes, splits the slots
// evenly and waits for the cluster to be ok; it returns their addresses and
// a plain client per node.
func startBenchCluster(b *testing.B, masters int) ([]string, []*redis.Client) {
	b.Helper()
	ctx := context.Background()
	var addrs []string
	var rdbs []*redis.Client
	for i := range masters {
		srv, err := redistest.StartServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		if err != nil {
			b.Fatalf("start cluster node: %v", err)
		}
		b.Cleanup(srv.Stop)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		b.Cleanup(func() { _ = rdb.Close() })
		lo, hi := i*16384/masters, (i+1)*16384/masters-1
		if err := rdb.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			b.Fatalf("ADDSLOTSRANGE: %v", err)
		}
		if i > 0 {
			if err := rdbs[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(srv.Port)).Err(); err != nil {
				b.Fatalf("CLUSTER MEET: %v", err)
			}
		}
		addrs, rdbs = append(addrs, srv.Addr), append(rdbs, rdb)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ok := true
		for _, rdb := range rdbs {
			info := rdb.ClusterInfo(ctx).Val()
			ok = ok && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)+"\r")
		}
		if ok {
			return addrs, rdbs
		}
		if time.Now().After(deadline) {
			b.Fatal("cluster not ok within 30s")
		}
	}
}

// redisCPU is the CPU time (user + system, all threads) the private Redis
// servers have used, from INFO cpu.
func redisCPU(tb testing.TB, admins ...*redis.Client) time.Duration {
	tb.Helper()
	var total float64
	for _, admin := range admins {
		txt, err := admin.Info(context.Background(), "cpu").Result()
		if err != nil {
			tb.Fatalf("INFO cpu: %v", err)
		}
		total += cpuSeconds(txt)
	}
	return time.Duration(total * float64(time.Second))
}

// cpuSeconds adds used_cpu_sys and used_cpu_user of an INFO cpu reply.
func cpuSeconds(txt string) float64 {
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
	return total
}
