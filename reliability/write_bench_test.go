// This file measures what strict coherence costs writers: Set and Delete latency with 1, 4 and 16 other OS processes holding
// near caches of the same keys, against the same writes without near
// caches, and with one of 4 processes frozen (SIGSTOP) for the whole run;
// and, in the scale rows, what a
// Set costs Redis as the number of processes grows.
package reliability_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func init() { childModes["near-holder"] = runNearHolderChild }

// writeKeys is how many keys the writer cycles through, all of them held in
// every process's near cache.
const writeKeys = 10

// BenchmarkWrite reports Set and Delete latency, p50 and p99 in
// microseconds, and the same for a PING (one round trip) measured in the
// same run, so that the cost reads in round trips; and what the writes cost
// Redis: its CPU (INFO cpu) and the commands it ran (INFO commandstats, the
// writer's PINGs left out) per write, a Set or a Delete, on a private
// redis-server that nothing else uses:
//
//	go test -run '^$' -bench BenchmarkWrite -benchtime 2000x ./reliability/
//
// Rows: off (no near cache anywhere), procs=N (the writer and N other
// processes with near caches), procs=4/frozen=1 (one of them SIGSTOPped
// throughout: writes within its last lease wait for it, later ones do
// not). The scale/ rows are described at benchScale; the large ones run
// only when the -bench pattern names sub-benchmarks (has a '/').
func BenchmarkWrite(b *testing.B) {
	b.Run("off", func(b *testing.B) { benchWrite(b, 0, false, false) })
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("procs=%d", n), func(b *testing.B) { benchWrite(b, n, true, false) })
	}
	b.Run("procs=4/frozen=1", func(b *testing.B) { benchWrite(b, 4, true, true) })
	for _, r := range scaleRows() {
		b.Run(r.name(), func(b *testing.B) { benchScale(b, r) })
	}
}

// privateRedis starts a redis-server for one row: its CPU and command
// counters then count that row's work only, not other tests' or agents'.
func privateRedis(b *testing.B) string {
	return redistest.PrivateServer(b, "BenchmarkWrite reads Redis's CPU and command counters").Addr
}

// redisStats is what a Redis server has spent so far.
type redisStats struct {
	cpu   time.Duration // used_cpu_sys + used_cpu_user, every thread
	calls int64         // commands run, those inside scripts included
}

// readRedisStats reads INFO cpu and commandstats. A second reading's delta
// includes the first INFO (a command counts once it has run).
func readRedisStats(b *testing.B, rdb *redis.Client) redisStats {
	info, err := rdb.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var s redisStats
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO %s: %v", line, err)
			}
			s.cpu += time.Duration(f * 1e9)
		case strings.HasPrefix(k, "cmdstat_"):
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				b.Fatalf("INFO %s: %v", line, err)
			}
			s.calls += n
		}
	}
	return s
}

// reportRedisPerWrite reports Redis CPU (µs) and commands per write between
// two readings; the INFO between them and probes (the writer's own PINGs,
// which time a round trip and are no part of a write) are left out of the
// commands.
func reportRedisPerWrite(b *testing.B, before, after redisStats, writes, probes int) {
	calls := after.calls - before.calls - 1 - int64(probes)
	b.ReportMetric(float64(after.cpu-before.cpu)/1e3/float64(writes), "redis-cpu-us/write")
	b.ReportMetric(float64(calls)/float64(writes), "redis-cmds/write")
}

func benchWrite(b *testing.B, procs int, near, freeze bool) {
	addr := privateRedis(b)
	direct := newClient(b, addr, nil)
	p := redistest.Prefix(b, direct)
	opts := []cache.Option{cache.WithPrefix(p)}
	if !near {
		opts = append(opts, cache.WithoutNearCache())
	}
	w := cache.New[string](newClient(b, addr, nil), opts...)
	defer w.Close()
	ctx := context.Background()
	kids := make([]*proctest.Child, procs)
	for i := range kids {
		kids[i] = proctest.Start(b, "near-holder", map[string]string{"REDIS": addr, "PREFIX": p})
	}
	for _, k := range kids {
		k.Expect(b, "ready", 20*time.Second)
	}
	if freeze {
		if err := kids[0].Process().Signal(syscall.SIGSTOP); err != nil {
			b.Fatal(err)
		}
	}
	// Past the registry's first lease: a new registry makes the first
	// writes wait out one lease (leases a lost registry forgot).
	time.Sleep(nearLease + 100*time.Millisecond)
	sets := make([]time.Duration, 0, b.N)
	dels := make([]time.Duration, 0, b.N)
	pings := make([]time.Duration, 0, b.N)
	before := readRedisStats(b, direct)
	b.ResetTimer()
	for i := range b.N {
		key := "k" + strconv.Itoa(i%writeKeys)
		t0 := time.Now()
		if err := w.Set(ctx, key, "v"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := w.Delete(ctx, key); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := direct.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		sets, dels, pings = append(sets, t1.Sub(t0)), append(dels, t2.Sub(t1)), append(pings, time.Since(t2))
		if i%writeKeys == writeKeys-1 {
			time.Sleep(time.Millisecond) // let the holders read the keys back into memory
		}
	}
	b.StopTimer()
	reportRedisPerWrite(b, before, readRedisStats(b, direct), 2*b.N, b.N)
	q := func(d []time.Duration, f float64) float64 {
		slices.Sort(d)
		return float64(d[int(f*float64(len(d)-1))]) / 1e3
	}
	b.ReportMetric(q(sets, 0.5), "set-p50-us")
	b.ReportMetric(q(sets, 0.99), "set-p99-us")
	b.ReportMetric(q(dels, 0.5), "del-p50-us")
	b.ReportMetric(q(dels, 0.99), "del-p99-us")
	b.ReportMetric(q(pings, 0.5), "rtt-p50-us")
	b.ReportMetric(q(dels, 1), "del-max-us")
}

// runNearHolderChild keeps the writer's keys in its near cache: it reads
// them every 10 milliseconds (each read after a write goes to Redis and puts the
// new value in memory) until it is killed.
func runNearHolderChild(env func(string) string) int {
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	defer rdb.Close()
	var hits atomic.Int64
	c := cache.New[string](rdb, cache.WithPrefix(env("PREFIX")), cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearHit {
			hits.Add(1)
		}
	}))
	defer c.Close()
	ctx := context.Background()
	load := func(context.Context) (string, error) { return "loaded", nil }
	for hits.Load() == 0 { // ready once memory serves: the lease is held
		_, _ = c.GetOrLoad(ctx, "k0", load)
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("ready")
	go func() { // stdin closes when the test ends
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}()
	for {
		for i := range writeKeys {
			_, _ = c.GetOrLoad(ctx, "k"+strconv.Itoa(i), load)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
