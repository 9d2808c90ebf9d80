// near_test.go measures the near cache across OS processes (issue 21): three
// reader processes serve a key from memory in a loop while a fourth process
// overwrites it with Set; how long after Set returned does any process still
// begin a read that gets the old value? With the invalidation connections
// killed every 300ms, no such read may begin later than the near cache's
// cap (WithNearMaxAge).
package reliability_test

import (
	"bufio"
	"context"
	"fmt"
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
	"github.com/stampede-go/stampede/internal/redistest"
)

func init() { childModes["near-reader"] = runNearReaderChild }

// nearMaxAge is the cap the processes of these tests use.
const nearMaxAge = 500 * time.Millisecond

// nearRound is what one reader process saw in one round.
type nearRound struct {
	reads, nearHits int64
	oldAfter        int64         // reads that began after Set returned and got the old value
	lag             time.Duration // how long after Set returned the last of them began (0: none)
}

// invalidationRounds runs rounds of: readers warm on v<r>, the writer Sets
// v<r>-new and says when Set returned, readers report. With kill, every
// invalidation connection is killed every 300ms throughout.
func invalidationRounds(tb testing.TB, rounds int, kill bool) []nearRound {
	addr := redistest.Addr(tb)
	direct := newClient(tb, addr, nil)
	p := redistest.Prefix(tb, direct)
	writer := cache.New[string](newClient(tb, addr, nil), cache.WithPrefix(p), cache.WithNearCache(1<<20), cache.WithNearMaxAge(nearMaxAge))
	tb.Cleanup(func() { writer.Close() })
	const readers = 3
	kids := make([]*child, readers)
	for i := range kids {
		kids[i] = startChild(tb, "near-reader", map[string]string{"REDIS": addr, "PREFIX": p, "ROUNDS": strconv.Itoa(rounds)})
	}
	if kill {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { killNearConns(direct, stop) })
		tb.Cleanup(func() { close(stop); wg.Wait() })
	}
	var out []nearRound
	for r := range rounds {
		key := "k" + strconv.Itoa(r)
		if err := writer.Set(context.Background(), key, "old"); err != nil {
			tb.Fatal(err)
		}
		for _, k := range kids {
			k.expect(tb, "ready", 10*time.Second)
			k.send(tb, "go "+key)
		}
		for _, k := range kids {
			k.expect(tb, "warm", 20*time.Second) // serving from memory
		}
		if kill { // and once right before the write: its invalidation is surely lost
			killNearConnsOnce(direct)
		}
		if err := writer.Set(context.Background(), key, "new"); err != nil {
			tb.Fatal(err)
		}
		done := time.Now().UnixNano()
		time.Sleep(nearMaxAge + 100*time.Millisecond) // past the cap: every reader has seen "new"
		for _, k := range kids {
			k.send(tb, "stop "+strconv.FormatInt(done, 10))
		}
		for _, k := range kids {
			f := strings.Fields(k.expect(tb, "result", 10*time.Second))
			var nr nearRound
			nr.reads, _ = strconv.ParseInt(f[0], 10, 64)
			nr.nearHits, _ = strconv.ParseInt(f[1], 10, 64)
			nr.oldAfter, _ = strconv.ParseInt(f[2], 10, 64)
			lag, _ := strconv.ParseInt(f[3], 10, 64)
			nr.lag = time.Duration(lag)
			out = append(out, nr)
		}
	}
	return out
}

// killNearConns kills every near-cache invalidation connection on the
// server every 300ms until stop is closed.
func killNearConns(rdb *redis.Client, stop <-chan struct{}) {
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		killNearConnsOnce(rdb)
	}
}

func killNearConnsOnce(rdb *redis.Client) {
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		return
	}
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, " name=stampede-near ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				rdb.ClientKillByFilter(context.Background(), "ID", id)
			}
		}
	}
}

// runNearReaderChild reads one key per round in a loop from a near-cached
// Cache, and reports how many reads that began after the writer's Set
// returned still got the old value.
func runNearReaderChild(env func(string) string) int {
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	defer rdb.Close()
	var nearHits atomic.Int64
	c := cache.New[string](rdb, cache.WithPrefix(env("PREFIX")), cache.WithNearCache(1<<20), cache.WithNearMaxAge(nearMaxAge),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				nearHits.Add(1)
			}
		}))
	defer c.Close()
	rounds, _ := strconv.Atoi(env("ROUNDS"))
	in := bufio.NewScanner(os.Stdin)
	load := func(context.Context) (string, error) { return "", fmt.Errorf("the writer stores every value") }
	for range rounds {
		fmt.Println("ready")
		if !in.Scan() {
			return 2
		}
		key := strings.TrimPrefix(in.Text(), "go ")
		var (
			stop    atomic.Bool
			reads   atomic.Int64
			mu      sync.Mutex
			oldAt   []int64 // when reads that got "old" began, Unix ns (the last 4096)
			warm    = make(chan struct{})
			warmed  sync.Once
			hits0   = nearHits.Load()
			readers sync.WaitGroup
		)
		readers.Go(func() {
			for !stop.Load() {
				begun := time.Now().UnixNano()
				v, err := c.GetOrLoad(context.Background(), key, load)
				reads.Add(1)
				if err == nil && v == "old" {
					mu.Lock()
					if len(oldAt) == 4096 {
						oldAt = oldAt[1:]
					}
					oldAt = append(oldAt, begun)
					mu.Unlock()
					if nearHits.Load()-hits0 >= 100 {
						warmed.Do(func() { close(warm) })
					}
				}
				time.Sleep(50 * time.Microsecond) // leave the CPUs to the other processes
			}
		})
		<-warm
		fmt.Println("warm")
		if !in.Scan() {
			return 2
		}
		done, _ := strconv.ParseInt(strings.TrimPrefix(in.Text(), "stop "), 10, 64)
		stop.Store(true)
		readers.Wait()
		var after, lag int64
		for _, at := range oldAt {
			if at > done {
				after++
				lag = max(lag, at-done)
			}
		}
		fmt.Println("result", reads.Load(), nearHits.Load()-hits0, after, lag)
	}
	return 0
}

// TestNearCacheAcrossProcesses: no read that begins later than the cap after
// Set returned gets the old value, with and without the invalidation
// connections being killed; every process served from memory.
func TestNearCacheAcrossProcesses(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill=%v", kill), func(t *testing.T) {
			res := invalidationRounds(t, 5, kill)
			var lags []time.Duration
			var hits, old int64
			for _, r := range res {
				hits += r.nearHits
				old += r.oldAfter
				lags = append(lags, r.lag)
				if r.lag >= nearMaxAge {
					t.Errorf("a read began %v after Set returned and got the old value; the cap is %v", r.lag, nearMaxAge)
				}
				if !kill && r.lag >= nearMaxAge/2 { // loose: measured under 1ms
					t.Errorf("a read began %v after Set returned and got the old value: the invalidation did not come", r.lag)
				}
			}
			slices.Sort(lags)
			t.Logf("%d process-rounds, %d near hits, %d old reads after Set returned; latest began %v after it",
				len(res), hits, old, lags[len(lags)-1])
			if hits < int64(len(res))*100 {
				t.Errorf("only %d near hits in %d process-rounds: memory was not serving", hits, len(res))
			}
		})
	}
}

// BenchmarkInvalidation reports, over 4 OS processes (one writing, three
// reading from memory), the time from Set returning to the last read that
// began and still got the old value, per process and round: p50, p99, max.
//
//	go test -run '^$' -bench BenchmarkInvalidation -benchtime 40x ./reliability/
func BenchmarkInvalidation(b *testing.B) {
	for _, kill := range []bool{false, true} {
		b.Run(fmt.Sprintf("kill=%v", kill), func(b *testing.B) {
			res := invalidationRounds(b, b.N, kill)
			lags := make([]time.Duration, len(res))
			var old int64
			for i, r := range res {
				lags[i] = r.lag
				old += r.oldAfter
			}
			slices.Sort(lags)
			q := func(f float64) float64 { return float64(lags[int(f*float64(len(lags)-1))]) / 1e6 }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(1), "max-ms")
			b.ReportMetric(float64(old)/float64(len(res)), "old-reads/op")
		})
	}
}
