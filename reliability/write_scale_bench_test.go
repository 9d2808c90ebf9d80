// This file is BenchmarkWrite's scale rows: what one Set costs Redis (CPU, commands) and the writer (p50, p99) as
// the number of other processes with near caches grows, so that BENCHMARKS.md
// can model writes per second per Redis core against the size of a service.
package reliability_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
)

func init() { childModes["scale-holder"] = runScaleHolderChild }

// maxScaleProcs is the most OS processes a row starts: beyond it a child
// runs several Caches, each on a redis client of its own, so that Redis
// sees one more tracking connection and one more lease holder per Cache, as
// from one more process, without 32 Go runtimes on 2 cores.
const maxScaleProcs = 16

// readLoad is the read-load rows' shape: readProcs processes of readGoroutines
// goroutines each reading readKeys keys without pause, among which the
// writer writes.
const (
	readProcs      = 3
	readGoroutines = 64
	readKeys       = 1000
)

// scaleRow is one row: near is the near cache of every process ("off",
// "strict", the default, "perkey", strict WithNearPerKey, or "eventual",
// WithEventualNearCache); procs the
// other processes (Caches beyond maxScaleProcs); hold whether they hold the
// keys the writer Sets ("written") or 10 other keys of the prefix ("other");
// writers the writer process's goroutines writing at once; reads, instead of
// holders, the read load of readLoad.
type scaleRow struct {
	near    string
	procs   int
	hold    string
	writers int
	reads   bool
}

func (r scaleRow) name() string {
	switch {
	case r.reads:
		return "scale/reads/near=" + r.near
	case r.near == "off":
		return fmt.Sprintf("scale/near=off/writers=%d", r.writers)
	}
	return fmt.Sprintf("scale/near=%s/procs=%d/hold=%s/writers=%d", r.near, r.procs, r.hold, r.writers)
}

// byDefault reports whether the row runs without being named: the off
// baselines and 16 processes' headline rows, so that -bench BenchmarkWrite
// stays a couple of minutes.
func (r scaleRow) byDefault() bool {
	switch {
	case r.reads || r.writers == 16:
		return false
	case r.near == "off":
		return true
	case r.procs != 16:
		return false
	case r.near == "eventual" || r.near == "perkey":
		return r.hold == "written" && r.writers == 1
	}
	return r.hold == "written" || r.writers == 1
}

// scaleRows lists the rows to run: all of them when the -bench pattern
// names sub-benchmarks (it has a '/'; Go's matcher then picks among them),
// else only the default ones.
func scaleRows() []scaleRow {
	all := []scaleRow{{near: "off", writers: 1}, {near: "off", writers: 8}, {near: "off", writers: 16}}
	for _, near := range []string{"strict", "perkey", "eventual"} {
		for _, procs := range []int{1, 4, 16, 32, 100, 400} {
			for _, hold := range []string{"written", "other"} {
				for _, writers := range []int{1, 8, 16} {
					all = append(all, scaleRow{near: near, procs: procs, hold: hold, writers: writers})
				}
			}
		}
	}
	for _, near := range []string{"off", "strict", "eventual"} {
		all = append(all, scaleRow{near: near, writers: 1, reads: true})
	}
	f := flag.Lookup("test.bench")
	if f != nil && strings.Contains(f.Value.String(), "/") {
		return all
	}
	return slices.DeleteFunc(all, func(r scaleRow) bool { return !r.byDefault() })
}

// nearOption appends to opts the near cache of a process of the row.
func nearOption(near string, opts ...cache.Option) []cache.Option {
	switch near {
	case "off":
		return append(opts, cache.WithoutNearCache())
	case "eventual":
		return append(opts, cache.WithEventualNearCache(nearMaxAge))
	case "perkey":
		return append(opts, cache.WithNearMaxAge(nearMaxAge), cache.WithNearPerKey()) // (capped at 59s)
	}
	return append(opts, cache.WithNearMaxAge(nearMaxAge)) // the same age as eventual's: only the coherence differs
}

// benchScale times b.N Sets by the row's writers after its other processes
// hold their keys, on a private redis-server, and reports per Set: Redis CPU
// and commands (everything Redis did meanwhile, the other processes'
// re-reads, acknowledgements and lease renewals included: what the write
// costs the service's Redis), p50 and p99, the writes per second, the Sets
// that waited out a lease, and Redis's CPU per second before the writes.
func benchScale(b *testing.B, r scaleRow) {
	addr := privateRedis(b)
	direct := newClient(b, addr, nil)
	p := "scale:"
	var leaseWaits atomic.Int64
	w := cache.New[string](newClient(b, addr, nil), nearOption(r.near, cache.WithPrefix(p),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearLeaseWait {
				leaseWaits.Add(1)
			}
		}))...)
	defer w.Close()
	ctx := context.Background()

	written, nkeys := "k", writeKeys
	if r.reads {
		nkeys = readKeys
	}
	held := written
	if r.hold == "other" {
		held = "o"
	}
	// Every key exists before anyone reads it, so that no holder loads
	// (a load's commit is a write of its own) and the timed writes are the
	// writer's only.
	for _, name := range []string{written, held} {
		for i := range nkeys {
			if err := w.Set(ctx, name+strconv.Itoa(i), "v"); err != nil {
				b.Fatal(err)
			}
		}
	}
	procs, caches := r.procs, 1
	switch {
	case procs >= 100: // as the fleet rows were first measured: 4 processes of procs/4 Caches
		procs, caches = 4, r.procs/4
	case procs > maxScaleProcs:
		procs, caches = maxScaleProcs, r.procs/maxScaleProcs
	}
	env := map[string]string{"REDIS": addr, "PREFIX": p, "NEAR": r.near, "KEYS": held,
		"NKEYS": strconv.Itoa(nkeys), "CACHES": strconv.Itoa(caches), "READERS": "0"}
	if r.reads {
		procs = readProcs
		env["READERS"] = strconv.Itoa(readGoroutines)
	}
	kids := make([]*proctest.Child, procs)
	for i := range kids {
		kids[i] = proctest.Start(b, "scale-holder", env)
	}
	for _, k := range kids {
		k.Expect(b, "ready", 60*time.Second)
	}
	// Past the registry's first lease (a new registry makes the first
	// writes wait out one lease), and time for the holders to read every
	// key into memory; then Redis's CPU without writes (lease renewals, the
	// read load), which the per-write figures include for as long as the
	// writes take.
	time.Sleep(nearLease)
	idle0 := readRedisStats(b, direct)
	const idle = 500 * time.Millisecond
	time.Sleep(idle)
	idleCPU := readRedisStats(b, direct).cpu - idle0.cpu

	sets := make([][]time.Duration, r.writers)
	var next atomic.Int64
	var wg sync.WaitGroup
	before := readRedisStats(b, direct)
	b.ResetTimer()
	start := time.Now()
	for g := range r.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := w.Set(ctx, written+strconv.Itoa(int(i)%nkeys), "v"+strconv.FormatInt(i, 10)); err != nil {
					b.Error(err)
					return
				}
				sets[g] = append(sets[g], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	reportRedisPerWrite(b, before, readRedisStats(b, direct), b.N, 0)
	all := slices.Concat(sets...)
	slices.Sort(all)
	q := func(f float64) float64 { return float64(all[int(f*float64(len(all)-1))]) / 1e3 }
	b.ReportMetric(q(0.5), "set-p50-us")
	b.ReportMetric(q(0.99), "set-p99-us")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
	b.ReportMetric(float64(leaseWaits.Load()), "lease-waits")
	b.ReportMetric(float64(idleCPU)/1e6/idle.Seconds(), "idle-redis-cpu-ms/s")
}

// runScaleHolderChild runs CACHES Caches, each on a redis client of its own
// (one more process as Redis sees it), with the near cache NEAR, holding the
// keys KEYS0..KEYS<NKEYS-1>: with READERS=0 it reads them all every 10ms
// (each read after a write goes to Redis and puts the new value in memory),
// else READERS goroutines per Cache read them at random without pause (the
// read load). It runs until stdin closes.
func runScaleHolderChild(env func(string) string) int {
	caches, _ := strconv.Atoi(env("CACHES"))
	nkeys, _ := strconv.Atoi(env("NKEYS"))
	readers, _ := strconv.Atoi(env("READERS"))
	name, near := env("KEYS"), env("NEAR")
	ctx := context.Background()
	load := func(context.Context) (string, error) { return "loaded", nil }
	cs := make([]*cache.Cache[string], caches)
	for i := range cs {
		rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
		defer rdb.Close()
		var hits atomic.Int64
		cs[i] = cache.New[string](rdb, nearOption(near, cache.WithPrefix(env("PREFIX")),
			cache.WithObserver(func(e cache.Event) {
				if e.Kind == cache.EventNearHit {
					hits.Add(1)
				}
			}))...)
		defer cs[i].Close()
		// Ready once memory serves (a strict Cache then holds its lease),
		// or, without a near cache, once Redis answers.
		for {
			_, err := cs[i].GetOrLoad(ctx, name+"0", load)
			if hits.Load() > 0 || (near == "off" && err == nil) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	fmt.Println("ready")
	go func() { // stdin closes when the benchmark ends
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}()
	if readers > 0 {
		for _, c := range cs {
			for range readers {
				go func() {
					for {
						_, _ = c.GetOrLoad(ctx, name+strconv.Itoa(rand.IntN(nkeys)), load)
					}
				}()
			}
		}
		select {}
	}
	for {
		for _, c := range cs {
			for i := range nkeys {
				_, _ = c.GetOrLoad(ctx, name+strconv.Itoa(i), load)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}
