// This file checks the guarantee of Delete across instances and
// OS processes: a GetOrLoad that starts after Delete
// returns, in any process, never sees the value that Delete removed. The
// source of truth is versioned; it is bumped to v2 just before the Delete,
// and every read that began after the Delete returned and got v1 is a stale
// read.
package reliability_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

// versioned is a source of truth whose value changes: a load reads the
// version when it starts and answers after delay, as a slow query does.
type versioned struct {
	ver     atomic.Int64
	loads   atomic.Int64
	delay   time.Duration
	started chan int // receives the instance of each load as it starts, if there is room
}

func newVersioned(delay time.Duration) *versioned {
	s := &versioned{delay: delay, started: make(chan int, 1)}
	s.ver.Store(1)
	return s
}

// loader is the loader instance inst passes to GetOrLoad.
func (s *versioned) loader(inst int) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		v := s.ver.Load()
		s.loads.Add(1) // after the read: a test that sees the count knows the version read
		select {
		case s.started <- inst:
		default:
		}
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return "v" + strconv.FormatInt(v, 10), nil
	}
}

// staleCount counts the reads of one round.
type staleCount struct {
	reads, after, stale, errs atomic.Int64
	mu                        sync.Mutex // protects late and firstErr
	late                      time.Duration
	firstErr                  error
}

// count records one read; after says whether it began after Delete
// returned, late how long after.
func (s *staleCount) count(after bool, v string, err error, late time.Duration) {
	s.reads.Add(1)
	if after {
		s.after.Add(1)
	}
	switch {
	case err != nil:
		s.errs.Add(1)
		s.mu.Lock()
		if s.firstErr == nil {
			s.firstErr = err
		}
		s.mu.Unlock()
	case after && v == "v1":
		s.stale.Add(1)
		s.mu.Lock()
		s.late = max(s.late, late)
		s.mu.Unlock()
	}
}

func (s *staleCount) add(o *staleCount) {
	s.reads.Add(o.reads.Load())
	s.after.Add(o.after.Load())
	s.stale.Add(o.stale.Load())
	s.errs.Add(o.errs.Load())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.late = max(s.late, o.late)
	if s.firstErr == nil {
		s.firstErr = o.firstErr
	}
}

// TestDeleteInAnotherInstance reads on 3 instances (each its own client,
// singleflight group and pool), a new read every 2ms plus 4 readers in a
// loop on each, while another instance than the loader's deletes
// the key, in two shapes: while the first v1 load is still running
// ("during-load": the holder's fenced commit writes nothing, but its flight
// still answers), and once v1 is cached and read by every instance
// ("after-commit"). No read that starts after Delete returned may get v1.
func TestDeleteInAnotherInstance(t *testing.T) {
	t.Parallel()
	for _, shape := range []string{"during-load", "after-commit"} {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			addr := redistest.Addr(t)
			direct := newClient(t, addr, nil)
			p := redistest.Prefix(t, direct)
			const instances, readers, rounds = 3, 4, 10
			const delay, tick = 150 * time.Millisecond, 2 * time.Millisecond
			cs := procs(t, instances, addr, nil, cache.WithRetry(400, 10*time.Millisecond))
			var total staleCount
			for r := range rounds {
				key := p + "k" + strconv.Itoa(r)
				src := newVersioned(delay)
				var (
					deleted   atomic.Bool
					deletedAt time.Time // written before deleted is set
					stop      atomic.Bool
					wg        sync.WaitGroup
					round     staleCount
				)
				read := func(i int, c *cache.Cache[string]) {
					after := deleted.Load()
					begun := time.Now()
					v, err := c.GetOrLoad(context.Background(), key, src.loader(i))
					var late time.Duration
					if after { // deletedAt is set before deleted
						late = begun.Sub(deletedAt)
					}
					round.count(after, v, err, late)
				}
				for i, c := range cs {
					// An open-loop client: a new read every tick, whatever
					// the others do, so reads join flights at any moment...
					wg.Go(func() {
						for !stop.Load() {
							wg.Go(func() { read(i, c) })
							time.Sleep(tick)
						}
					})
					// ...and closed-loop readers, a read as soon as the last
					// one returned, so hits overlap the Delete.
					for range readers {
						wg.Go(func() {
							for !stop.Load() {
								read(i, c)
								time.Sleep(time.Millisecond)
							}
						})
					}
				}
				holder := <-src.started // the first v1 load is running
				if shape == "after-commit" {
					eventually(t, 5*time.Second, "v1 cached", func() bool { return stored(t, direct, key) == `"v1"` })
					time.Sleep(20 * time.Millisecond) // every instance reads the hit
				} else {
					time.Sleep(delay / 3)
				}
				src.ver.Store(2)
				deleter := cs[(holder+1)%instances] // another instance than the loader's
				if err := deleter.Delete(context.Background(), key); err != nil {
					t.Fatalf("Delete: %v", err)
				}
				deletedAt = time.Now()
				deleted.Store(true)
				time.Sleep(2*delay + 200*time.Millisecond) // the v1 flight ends, v2 is loaded and read
				stop.Store(true)
				wg.Wait()
				if got := stored(t, direct, key); got != `"v2"` {
					t.Errorf("round %d: stored %s after the Delete; want %q", r, got, `"v2"`)
				}
				total.add(&round)
			}
			if n := total.stale.Load(); n != 0 {
				t.Errorf("%d of %d reads that began after Delete returned got v1 (the deleted value), up to %v after it",
					n, total.after.Load(), total.late.Round(time.Millisecond))
			}
			if n := total.errs.Load(); n != 0 {
				t.Errorf("%d reads failed; first: %v", n, total.firstErr)
			}
			if total.after.Load() < rounds {
				t.Errorf("only %d reads began after the Deletes; the test proves nothing", total.after.Load())
			}
			t.Logf("figures: %s, %d rounds, %d instances each starting a read every %v and running %d readers in a loop, load %v: %d reads, %d began after Delete returned, %d stale (latest %v after the Delete), %d errors",
				shape, rounds, instances, tick, readers, delay, total.reads.Load(), total.after.Load(), total.stale.Load(),
				total.late.Round(time.Millisecond), total.errs.Load())
		})
	}
}

// TestDeleteInAnotherProcess is the same guarantee with real OS processes:
// three children of the test binary read the key in a loop, the test
// process deletes it while a child loads v1, and tells the children through
// Redis: a child checks the flag before each read, so a read that saw the
// flag began after Delete returned.
func TestDeleteInAnotherProcess(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	ctx := context.Background()
	const children, readers, rounds = 3, 4, 6
	const delay, tick = 200 * time.Millisecond, 2 * time.Millisecond
	var kids []*proctest.Child
	for range children {
		kids = append(kids, proctest.Start(t, "reader", map[string]string{
			"REDIS": addr, "PREFIX": p, "ROUNDS": strconv.Itoa(rounds),
			"TICK": tick.String(), "READERS": strconv.Itoa(readers), "DELAY": delay.String(),
		}))
	}
	deleter := cache.New[string](direct)
	var reads, after, stale, errs int64
	var late time.Duration
	for r := range rounds {
		rk := func(what string) string { return p + what + ":" + strconv.Itoa(r) }
		key := p + "k" + strconv.Itoa(r)
		if err := direct.Set(ctx, rk("src"), "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range kids {
			k.Expect(t, "ready", 30*time.Second)
		}
		for _, k := range kids {
			k.Send(t, "go")
		}
		eventually(t, 10*time.Second, "a child loads v1", func() bool {
			n, _ := direct.Get(ctx, rk("loads")).Int()
			return n >= 1
		})
		time.Sleep(delay / 3)
		if err := direct.Set(ctx, rk("src"), "2", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := deleter.Delete(ctx, key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if err := direct.Set(ctx, rk("deleted"), time.Now().UnixNano(), 0).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2*delay + 300*time.Millisecond)
		if err := direct.Set(ctx, rk("stop"), 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
		for i, k := range kids {
			var rr, n, ra, rs, re int64
			var lateNs int64
			var first string
			line := k.Expect(t, "done", 30*time.Second)
			if _, err := fmt.Sscan(line, &rr, &n, &ra, &rs, &re, &lateNs); err != nil || rr != int64(r) {
				t.Fatalf("child %d: done %q: %v", i, line, err)
			}
			if _, rest, ok := strings.Cut(line, "|"); ok {
				first = rest
			}
			if re != 0 {
				t.Errorf("child %d round %d: %d reads failed; first: %s", i, r, re, first)
			}
			reads, after, stale, errs = reads+n, after+ra, stale+rs, errs+re
			late = max(late, time.Duration(lateNs))
		}
		if got := stored(t, direct, key); got != `"v2"` {
			t.Errorf("round %d: stored %s after the Delete; want %q", r, got, `"v2"`)
		}
	}
	if stale != 0 {
		t.Errorf("%d of %d reads in other processes that began after Delete returned got v1, up to %v after it",
			stale, after, late.Round(time.Millisecond))
	}
	if after < rounds {
		t.Errorf("only %d reads began after the Deletes; the test proves nothing", after)
	}
	t.Logf("figures: %d rounds, %d processes each starting a read every %v and running %d readers in a loop, load %v: %d reads, %d began after Delete returned, %d stale (latest %v after the Delete), %d errors",
		rounds, children, tick, readers, delay, reads, after, stale, late.Round(time.Millisecond), errs)
}

// runReaderChild is the child of TestDeleteInAnotherProcess. For each round
// it says "ready <round>", waits for a line, then starts a read of
// PREFIX+k<round> every TICK and runs READERS readers in a loop, until
// PREFIX+stop:<round> exists, with a loader that reads the version at
// PREFIX+src:<round>. It says
// "done <round> <reads> <after> <stale> <errors> <latest stale ns> |<first error>".
func runReaderChild(env func(string) string) int {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	defer rdb.Close()
	c := cache.New[string](rdb, cache.WithRetry(400, 10*time.Millisecond))
	p := env("PREFIX")
	rounds, _ := strconv.Atoi(env("ROUNDS"))
	tick, _ := time.ParseDuration(env("TICK"))
	readers, _ := strconv.Atoi(env("READERS"))
	delay, _ := time.ParseDuration(env("DELAY"))
	in := bufio.NewReader(os.Stdin)
	for r := range rounds {
		rk := func(what string) string { return p + what + ":" + strconv.Itoa(r) }
		key := p + "k" + strconv.Itoa(r)
		fmt.Println("ready", r)
		if _, err := in.ReadString('\n'); err != nil {
			return 2
		}
		load := func(ctx context.Context) (string, error) {
			rdb.Incr(ctx, rk("loads"))
			ver, err := rdb.Get(ctx, rk("src")).Result()
			if err != nil {
				return "", err
			}
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return "", ctx.Err()
			}
			return "v" + ver, nil
		}
		var (
			round staleCount
			wg    sync.WaitGroup
		)
		// check reports whether the round is over and whether Delete has
		// returned (with when, in Unix ns), before a read begins.
		check := func() (stop bool, after bool, at int64) {
			st, err := rdb.MGet(ctx, rk("deleted"), rk("stop")).Result()
			if err != nil || st[1] != nil {
				return true, false, 0
			}
			if st[0] != nil {
				at, _ = strconv.ParseInt(st[0].(string), 10, 64)
			}
			return false, st[0] != nil, at
		}
		read := func(after bool, at int64) {
			v, err := c.GetOrLoad(ctx, key, load)
			round.count(after, v, err, time.Duration(time.Now().UnixNano()-at))
		}
		for range readers { // closed-loop readers
			wg.Go(func() {
				for {
					stop, after, at := check()
					if stop {
						return
					}
					read(after, at)
					time.Sleep(time.Millisecond)
				}
			})
		}
		for { // an open-loop client: a new read every tick
			stop, after, at := check()
			if stop {
				break
			}
			wg.Go(func() { read(after, at) })
			time.Sleep(tick)
		}
		wg.Wait()
		first := ""
		if round.firstErr != nil {
			first = strings.ReplaceAll(round.firstErr.Error(), "\n", " ")
		}
		fmt.Println("done", r, round.reads.Load(), round.after.Load(), round.stale.Load(), round.errs.Load(), int64(round.late), "|"+first)
	}
	return 0
}

// TestDeleteWhileAHitIsInFlight takes the read path instead of the load
// path: instance A reads a cached v1 over a link whose replies take 50ms
// (Redis has answered, the reply is on its way); meanwhile instance B
// deletes the key, and then a new caller on A asks for it. That caller began
// after Delete returned, so it must not get v1, even though the read it
// could share was answered before the Delete.
func TestDeleteWhileAHitIsInFlight(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	ctx := context.Background()
	px := newProxy(t, addr)
	px.add(t, "slow-replies", "latency", "downstream", `{"latency":50}`)
	a := cache.New[string](newClient(t, px.Addr(), nil))
	b := cache.New[string](direct)
	const rounds = 20
	stale := 0
	for r := range rounds {
		key := p + "k" + strconv.Itoa(r)
		src := newVersioned(0)
		if v, err := b.GetOrLoad(ctx, key, src.loader(1)); err != nil || v != "v1" {
			t.Fatalf("GetOrLoad = %q, %v; want v1 cached", v, err)
		}
		first := make(chan string, 1)
		go func() {
			v, _ := a.GetOrLoad(ctx, key, src.loader(0))
			first <- v
		}()
		time.Sleep(15 * time.Millisecond) // A's GET has reached Redis; its reply has not reached A
		src.ver.Store(2)
		if err := b.Delete(ctx, key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		v, err := a.GetOrLoad(ctx, key, src.loader(0)) // begins after Delete returned
		if err != nil {
			t.Errorf("round %d: GetOrLoad after Delete: %v", r, err)
		}
		if v == "v1" {
			stale++
		}
		<-first
	}
	if stale != 0 {
		t.Errorf("%d of %d reads that began after Delete returned (in another instance) got v1, the deleted value, from a read sent before the Delete", stale, rounds)
	}
	t.Logf("figures: hit in flight on a link with 50ms replies, Delete in another instance, then a new read on the first: %d of %d got the deleted value", stale, rounds)
}

// TestUncachedNotFoundIsAnsweredOnce guards the fix of item 1 (a caller
// that began after a flight's answer was vouched for asks again): a loader's
// ErrNotFound with negative caching off is stored nowhere, and must still be
// answered once, not asked again and again.
func TestUncachedNotFoundIsAnsweredOnce(t *testing.T) {
	// Not parallel: its callers must merge within 20ms.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	key := redistest.Prefix(t, direct) + "absent"
	cs := procs(t, 2, addr, nil, cache.WithNotFoundTTL(0))
	var loads atomic.Int64
	load := func(context.Context) (string, error) {
		loads.Add(1)
		time.Sleep(20 * time.Millisecond) // let callers merge
		return "", cache.ErrNotFound
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var notFound, other atomic.Int64
	for _, c := range cs {
		for range 5 {
			wg.Go(func() {
				if _, err := c.GetOrLoad(ctx, key, load); errors.Is(err, cache.ErrNotFound) {
					notFound.Add(1)
				} else {
					other.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if notFound.Load() != 10 || loads.Load() > 4 {
		t.Errorf("10 callers of an absent key, negative caching off: %d got ErrNotFound, %d something else, %d loads; want 10 ErrNotFound from at most 2 loads per process",
			notFound.Load(), other.Load(), loads.Load())
	}
	t.Logf("figures: absent key, WithNotFoundTTL(0), 2 procs x 5 callers: %d ErrNotFound, %d other, loads=%d", notFound.Load(), other.Load(), loads.Load())
}

// TestDeleteWhileAnInstanceLoadsWithoutRedis covers FailOpen: instance A
// cannot reach Redis and serves from the source, uncached; the source
// changes and instance B (which can) deletes the key. A caller on A that
// begins after Delete returned must not get the value A's loader read
// before the change, even though that value never reached Redis.
func TestDeleteWhileAnInstanceLoadsWithoutRedis(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	ctx := context.Background()
	dead := newProxy(t, addr)
	dead.p.Stop()                                                  // A's Redis address refuses connections
	a := cache.New[string](newClient(t, dead.Addr(), refusedFast)) // FailOpen, the default
	b := cache.New[string](direct)
	const rounds = 10
	stale := 0
	for r := range rounds {
		key := p + "k" + strconv.Itoa(r)
		src := newVersioned(200 * time.Millisecond)
		if v, err := b.GetOrLoad(ctx, key, src.loader(1)); err != nil || v != "v1" {
			t.Fatalf("GetOrLoad = %q, %v; want v1 cached", v, err)
		}
		first := make(chan string, 1)
		go func() {
			v, _ := a.GetOrLoad(ctx, key, src.loader(0))
			first <- v
		}()
		for src.loads.Load() < 2 { // A's uncached load has read v1
			time.Sleep(time.Millisecond)
		}
		src.ver.Store(2)
		if err := b.Delete(ctx, key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		v, err := a.GetOrLoad(ctx, key, src.loader(0)) // begins after Delete returned
		if err != nil {
			t.Errorf("round %d: GetOrLoad after Delete: %v", r, err)
		}
		if v == "v1" {
			stale++
		}
		<-first
	}
	if stale != 0 {
		t.Errorf("%d of %d reads on the instance without Redis that began after Delete returned got v1, read from the source before the change", stale, rounds)
	}
	t.Logf("figures: FailOpen instance without Redis loading (200ms) while another instance deletes: %d of %d later reads got the old value", stale, rounds)
}

// TestDeleteDuringABatchLoad: instance A loads a key through GetOrLoadMany,
// which leads A's flight of the key; instance B deletes it meanwhile. A
// GetOrLoad on A that begins after Delete returned may share the batch's
// flight only if it is still good: it must not get v1.
func TestDeleteDuringABatchLoad(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	ctx := context.Background()
	cs := procs(t, 2, addr, nil)
	a, b := cs[0], cs[1]
	const rounds = 10
	stale := 0
	for r := range rounds {
		key := "k" + strconv.Itoa(r)
		src := newVersioned(200 * time.Millisecond)
		loadMany := func(ctx context.Context, keys []string) (map[string]string, error) {
			v, err := src.loader(0)(ctx)
			if err != nil {
				return nil, err
			}
			m := map[string]string{}
			for _, k := range keys {
				m[k] = v
			}
			return m, nil
		}
		batchDone := make(chan error, 1)
		go func() {
			_, err := a.GetOrLoadMany(ctx, []string{p + key}, loadMany)
			batchDone <- err
		}()
		for src.loads.Load() < 1 { // the batch's load has read v1
			time.Sleep(time.Millisecond)
		}
		src.ver.Store(2)
		if err := b.Delete(ctx, p+key); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		v, err := a.GetOrLoad(ctx, p+key, src.loader(0)) // begins after Delete returned
		if err != nil {
			t.Errorf("round %d: GetOrLoad after Delete: %v", r, err)
		}
		if v == "v1" {
			stale++
		}
		if err := <-batchDone; err != nil {
			t.Errorf("round %d: GetOrLoadMany: %v", r, err)
		}
	}
	if stale != 0 {
		t.Errorf("%d of %d reads that began after Delete returned got v1 from the batch's load", stale, rounds)
	}
	t.Logf("figures: GetOrLoadMany loading (200ms) while another instance deletes, then GetOrLoad on the batch's instance: %d of %d got the deleted version", stale, rounds)
}
