// This file proves read-after-write with the near cache on, across OS
// processes (issues 21 and 22): three reader processes serve a key from
// memory in a loop while a fourth process overwrites it with Set; no read
// that begins after Set returned, in any process, may get the old value.
// Each round attacks it with one fault: the invalidation connections killed
// every 300ms and right before the write, a reader process frozen with
// SIGSTOP across the write and past its lease, or Redis restarted between
// the readers' warm-up and the write.
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
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func init() { childModes["near-reader"] = runNearReaderChild }

// nearMaxAge is the cap the processes of these tests use: longer than any
// round, so that only invalidations and leases keep old values out; nearLease
// their coherence lease (the default).
const (
	nearMaxAge = time.Minute
	nearLease  = time.Second
)

// nearRound is what one reader process saw in one round.
type nearRound struct {
	reads, nearHits int64
	oldAfter        int64         // reads that began after Set returned and got the old value
	lag             time.Duration // how long after Set returned the last of them began (0: none)
}

// nearFault is what a round does to the processes or to Redis around the write.
type nearFault string

const (
	faultNone    nearFault = "none"
	faultKill    nearFault = "kill"    // invalidation connections killed every 300ms, and right before the write
	faultStop    nearFault = "stop"    // one reader SIGSTOPped before the write, resumed within its lease
	faultFreeze  nearFault = "freeze"  // one reader SIGSTOPped before the write, resumed past its lease
	faultRestart nearFault = "restart" // Redis restarted between warm-up and the write
)

// nearWriter is the writing process's side of a run.
type nearWriter struct {
	rounds     []nearRound
	leaseWaits int64           // writes that waited out a reader's lease instead of its acknowledgement
	setTimes   []time.Duration // how long each measured Set took
}

// nearOp is how the writer replaces the value the readers hold.
type nearOp string

const (
	opSet   nearOp = ""      // Set the new value
	opTag   nearOp = "tag"   // change the readers' source, then DeleteByTag the value's tag
	opClear nearOp = "clear" // change the readers' source, then Clear
)

// nearCoherence is the near cache of a run's processes: strict (the
// default), with perKey WithNearPerKey too, or with eventual
// WithEventualNearCache; each keeps values nearMaxAge at most.
func nearCoherence(eventual, perKey bool, opts ...cache.Option) []cache.Option {
	switch {
	case eventual:
		return append(opts, cache.WithEventualNearCache(nearMaxAge))
	case perKey:
		return append(opts, cache.WithNearMaxAge(nearMaxAge), cache.WithNearPerKey())
	}
	return append(opts, cache.WithNearMaxAge(nearMaxAge))
}

// nearRun is how a run's processes are set up: the fault of every round,
// whether every process runs WithEventualNearCache, and how late the
// readers hear Redis (a proxy delays its replies to them; 0: no proxy).
type nearRun struct {
	fault    nearFault
	eventual bool
	perKey   bool // strict, WithNearPerKey
	late     time.Duration
	op       nearOp
}

// invalidationRounds runs rounds of: readers warm on v<r>, the writer Sets
// v<r>-new and says when Set returned, readers report.
func invalidationRounds(tb testing.TB, rounds int, run nearRun) nearWriter {
	fault, eventual, op := run.fault, run.eventual, run.op
	addr := redistest.Addr(tb)
	var srv *redistest.Server
	if fault == faultRestart || fault == faultKill { // kill: it kills every near-cache connection on its server
		srv = redistest.PrivateServer(tb, "it restarts the server or kills its connections")
		addr = srv.Addr
	}
	readerAddr := addr
	if run.late > 0 {
		px := newProxy(tb, addr)
		px.add(tb, "late", "latency", "downstream", fmt.Sprintf(`{"latency":%d}`, run.late.Milliseconds()))
		readerAddr = px.Addr()
	}
	direct := newClient(tb, addr, nil)
	p := redistest.Prefix(tb, direct)
	var leaseWaits atomic.Int64
	writer := cache.New[string](newClient(tb, addr, nil), withTagsFor(op, nearCoherence(eventual, run.perKey, cache.WithPrefix(p), cache.WithNearCache(1<<20),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearLeaseWait {
				leaseWaits.Add(1)
			}
		}))...)...)
	tb.Cleanup(func() { writer.Close() })
	const readers = 3
	kids := make([]*proctest.Child, readers)
	for i := range kids {
		kids[i] = proctest.Start(tb, "near-reader", map[string]string{"REDIS": readerAddr, "PREFIX": p, "ROUNDS": strconv.Itoa(rounds), "EVENTUAL": strconv.FormatBool(eventual), "PERKEY": strconv.FormatBool(run.perKey), "OP": string(op)})
	}
	if fault == faultKill {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { killNearConns(direct, stop) })
		tb.Cleanup(func() { close(stop); wg.Wait() })
	}
	var out nearWriter
	for r := range rounds {
		key := "k" + strconv.Itoa(r)
		replace(tb, writer, direct, op, p, key, "old")
		for _, k := range kids {
			k.Expect(tb, "ready", 10*time.Second)
			k.Send(tb, "go "+key)
		}
		for _, k := range kids {
			k.Expect(tb, "warm", 20*time.Second) // serving from memory
		}
		switch fault {
		case faultKill: // and once right before the write: its invalidation is surely lost
			killNearConnsOnce(direct)
		case faultStop, faultFreeze:
			frozen := kids[r%readers].Process()
			if err := frozen.Signal(syscall.SIGSTOP); err != nil {
				tb.Fatal(err)
			}
			time.AfterFunc(stopFor(fault), func() { _ = frozen.Signal(syscall.SIGCONT) })
		case faultRestart:
			srv.Kill()
			if err := srv.Start(); err != nil {
				tb.Fatal(err)
			}
		}
		began := time.Now()
		replace(tb, writer, direct, op, p, key, "new")
		out.setTimes = append(out.setTimes, time.Since(began))
		done := time.Now().UnixNano()
		wait := 300 * time.Millisecond // every reader has read again since
		wait += stopFor(fault)         // and a frozen one has been running again for as long
		time.Sleep(wait)
		for _, k := range kids {
			k.Send(tb, "stop "+strconv.FormatInt(done, 10))
		}
		for _, k := range kids {
			f := strings.Fields(k.Expect(tb, "result", 10*time.Second))
			var nr nearRound
			nr.reads, _ = strconv.ParseInt(f[0], 10, 64)
			nr.nearHits, _ = strconv.ParseInt(f[1], 10, 64)
			nr.oldAfter, _ = strconv.ParseInt(f[2], 10, 64)
			lag, _ := strconv.ParseInt(f[3], 10, 64)
			nr.lag = time.Duration(lag)
			out.rounds = append(out.rounds, nr)
		}
	}
	out.leaseWaits = leaseWaits.Load()
	return out
}

// stopFor is how long a round of fault keeps a reader frozen.
func stopFor(fault nearFault) time.Duration {
	switch fault {
	case faultStop:
		return nearLease / 3 // the writer waits for it to come back and acknowledge
	case faultFreeze:
		return nearLease + 500*time.Millisecond // the writer waits out its lease; back, it must not serve
	}
	return 0
}

// setRetrying sets key, retrying while Redis restarts.
func setRetrying(tb testing.TB, c *cache.Cache[string], key, v string) {
	retrying(tb, func(ctx context.Context) error { return c.Set(ctx, key, v) })
}

// retrying runs a write until it succeeds, while Redis restarts.
func retrying(tb testing.TB, write func(context.Context) error) {
	var err error
	for range 100 {
		if err = write(context.Background()); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatal(err)
}

// replace makes v the value of key, as op does: for "old", the value is
// stored tagged "t"+key; for "new", DeleteByTag or Clear removes it after
// the readers' source (sourceKey) changed, and they load v.
func replace(tb testing.TB, c *cache.Cache[string], direct *redis.Client, op nearOp, p, key, v string) {
	if op == opSet {
		setRetrying(tb, c, key, v)
		return
	}
	retrying(tb, func(ctx context.Context) error { return direct.Set(ctx, sourceKey(p, key), v, time.Minute).Err() })
	switch {
	case v == "old":
		retrying(tb, func(ctx context.Context) error { return c.Set(ctx, key, v, cache.Tags("t"+key)) })
	case op == opTag:
		retrying(tb, func(ctx context.Context) error { return c.DeleteByTag(ctx, "t"+key) })
	default:
		retrying(tb, c.Clear)
	}
}

// sourceKey is the readers' database row of key (of prefix p), outside
// the cache's prefix.
func sourceKey(p, key string) string { return "stampede-test:source:" + p + key }

// withTagsFor adds WithTags to opts where op needs it: the Set runs check
// Caches without it.
func withTagsFor(op nearOp, opts ...cache.Option) []cache.Option {
	if op == opSet {
		return opts
	}
	return append(opts, cache.WithTags())
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
	eventual, _ := strconv.ParseBool(env("EVENTUAL"))
	perKey, _ := strconv.ParseBool(env("PERKEY"))
	c := cache.New[string](rdb, withTagsFor(nearOp(env("OP")), nearCoherence(eventual, perKey, cache.WithPrefix(env("PREFIX")), cache.WithNearCache(1<<20),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				nearHits.Add(1)
			}
		}))...)...)
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
		if nearOp(env("OP")) != opSet { // DeleteByTag and Clear remove the value: the readers load it from the source
			load = func(ctx context.Context) (string, error) { return rdb.Get(ctx, sourceKey(env("PREFIX"), key)).Result() }
		}
		r, ok := readUntilStopped(in, &nearHits, func() (string, error) { return c.GetOrLoad(context.Background(), key, load) })
		if !ok {
			return 2
		}
		fmt.Println("result", r.reads, r.hits, r.after, r.lag)
	}
	return 0
}

// oldReads is what a reader child saw in a round: its reads, the near hits
// meanwhile, how many reads that began after the stop's moment got "old",
// and how long after that moment the last of them began, in ns.
type oldReads struct {
	reads, hits, after, lag int64
}

// readUntilStopped is the reading half of a reader child's round: it calls
// read in a loop, noting when each read that got "old" began (the last
// 4096); once a read gets "old" with 100 near hits since it began, it says
// "warm"; told "stop <unix ns>" on in, it stops and counts the reads of
// "old" that began after that moment. ok is false when in ends first.
func readUntilStopped(in *bufio.Scanner, nearHits *atomic.Int64, read func() (string, error)) (r oldReads, ok bool) {
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
			v, err := read()
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
		return r, false
	}
	done, _ := strconv.ParseInt(strings.TrimPrefix(in.Text(), "stop "), 10, 64)
	stop.Store(true)
	readers.Wait()
	for _, at := range oldAt {
		if at > done {
			r.after++
			r.lag = max(r.lag, at-done)
		}
	}
	r.reads, r.hits = reads.Load(), nearHits.Load()-hits0
	return r, true
}

// TestNearCacheAcrossProcesses: no read that began after Set returned got
// the old value, in any process, under every fault; every process served
// from memory; the writer waited out a lease only when a reader was frozen
// or cut off.
func TestNearCacheAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, run := range []nearRun{
		{fault: faultNone}, {fault: faultKill}, {fault: faultStop}, {fault: faultFreeze}, {fault: faultRestart},
		{fault: faultNone, perKey: true}, {fault: faultKill, perKey: true}, {fault: faultStop, perKey: true},
		{fault: faultFreeze, perKey: true}, {fault: faultRestart, perKey: true},
	} {
		fault := run.fault
		name := string(fault)
		if run.perKey {
			name = "perkey/" + name
		}
		t.Run(name, func(t *testing.T) {
			if fault == faultFreeze || fault == faultRestart {
				// These two wait most (leases, a restart) and check no
				// lease wait that a busy machine could add: they run
				// together, after the others.
				t.Parallel()
			}
			w := invalidationRounds(t, 3, run)
			var hits, old int64
			for _, r := range w.rounds {
				hits += r.nearHits
				old += r.oldAfter
			}
			t.Logf("%d process-rounds, %d near hits, %d old reads after Set returned; %d lease waits; Set took %v",
				len(w.rounds), hits, old, w.leaseWaits, w.setTimes)
			if old > 0 {
				t.Errorf("%d reads began after Set returned and got the old value", old)
			}
			if hits < int64(len(w.rounds))*100 {
				t.Errorf("only %d near hits in %d process-rounds: memory was not serving", hits, len(w.rounds))
			}
			switch fault {
			case faultNone, faultStop:
				if w.leaseWaits != 0 {
					t.Errorf("%d writes waited out a lease with every reader running within it: acknowledgements did not come", w.leaseWaits)
				}
			case faultFreeze:
				// At least once: a reader whose lease had lapsed before the
				// freeze (renewals starved on a loaded machine) serves
				// nothing and is rightly not waited for.
				if w.leaseWaits < 1 {
					t.Errorf("no lease wait in %d rounds with a reader frozen: the frozen reader was not waited for", len(w.setTimes))
				}
			}
		})
	}
}

// BenchmarkInvalidation reports, over 4 OS processes (one writing, three
// reading from memory), how many reads began after Set returned and still
// got the old value (0 is the guarantee), how long Set took, and the lag:
// per reader process and write, how long after Set returned the last read
// that got the old value began (0 when none did). "eventual" runs every
// process with WithEventualNearCache, whose lag is the staleness it trades
// for writes that wait for nobody; "late" puts the readers 20ms behind a
// proxy, as a slow link or a busy process would.
//
//	go test -run '^$' -bench BenchmarkInvalidation -benchtime 20x ./reliability/
func BenchmarkInvalidation(b *testing.B) {
	const late = 20 * time.Millisecond
	for _, mode := range []struct {
		name string
		run  nearRun
	}{
		{"none", nearRun{fault: faultNone}},
		{"kill", nearRun{fault: faultKill}},
		{"late", nearRun{fault: faultNone, late: late}},
		{"eventual", nearRun{fault: faultNone, eventual: true}},
		{"eventual-late", nearRun{fault: faultNone, eventual: true, late: late}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			w := invalidationRounds(b, b.N, mode.run)
			var old int64
			lags := make([]time.Duration, 0, len(w.rounds))
			for _, r := range w.rounds {
				old += r.oldAfter
				lags = append(lags, r.lag)
			}
			slices.Sort(w.setTimes)
			slices.Sort(lags)
			q := func(d []time.Duration, f float64) float64 { return float64(d[int(f*float64(len(d)-1))]) / 1e6 }
			b.ReportMetric(q(w.setTimes, 0.5), "set-p50-ms")
			b.ReportMetric(q(w.setTimes, 0.99), "set-p99-ms")
			b.ReportMetric(float64(old)/float64(len(w.rounds)), "old-reads/op")
			b.ReportMetric(q(lags, 0.5), "lag-p50-ms")
			b.ReportMetric(q(lags, 0.99), "lag-p99-ms")
			b.ReportMetric(q(lags, 1), "lag-max-ms")
			b.ReportMetric(float64(w.leaseWaits)/float64(len(w.setTimes)), "lease-waits/op")
		})
	}
}

// TestTagDeleteAcrossProcesses: DeleteByTag and Clear keep the promise of
// Set across OS processes serving from memory: no read that began after
// either returned got the value it removed, with every process running,
// one frozen within its lease and one frozen past it.
func TestTagDeleteAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, op := range []nearOp{opTag, opClear} {
		for _, run := range []nearRun{{fault: faultNone}, {fault: faultStop}, {fault: faultFreeze}, {fault: faultFreeze, perKey: true}} {
			run.op = op
			name := string(op) + "/" + string(run.fault)
			if run.perKey {
				name += "/perkey"
			}
			t.Run(name, func(t *testing.T) {
				w := invalidationRounds(t, 2, run)
				var hits, old int64
				for _, r := range w.rounds {
					hits += r.nearHits
					old += r.oldAfter
				}
				t.Logf("%d process-rounds, %d near hits, %d old reads after %s returned; %d lease waits; it took %v",
					len(w.rounds), hits, old, op, w.leaseWaits, w.setTimes)
				if old > 0 {
					t.Errorf("%d reads began after %s returned and got the value it removed", old, op)
				}
				if hits < int64(len(w.rounds))*100 {
					t.Errorf("only %d near hits in %d process-rounds: memory was not serving", hits, len(w.rounds))
				}
			})
		}
	}
}
