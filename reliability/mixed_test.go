// This file proves read-after-write when processes are configured
// differently: readers with near caches in other OS processes
// (and, on a cluster, another client), one writer with WithoutNearCache()
// (an admin job): no read that begins after its Set returned may get the
// old value, since its writes wait for the readers' acknowledgements as a
// near-cached writer's do.
package reliability_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
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

// mixedRounds runs rounds of: the near-reader children warm
// on a key, a writer without a near cache Sets it, the children report the
// reads that began after Set returned and got the old value. The children
// reach Redis through a proxy that delays its replies by 20ms, so that
// their invalidations land well after a write returned unless the writer
// waited for them. With stop, one reader is SIGSTOPped across the write
// for a third of its lease.
func mixedRounds(t *testing.T, rounds int, stop, perKey bool) (old, hits, leaseWaits int64, setTimes []time.Duration) {
	addr := redistest.Addr(t)
	px := newProxy(t, addr)
	px.add(t, "late", "latency", "downstream", `{"latency":20}`)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	var waits atomic.Int64
	writer := cache.New[string](newClient(t, addr, nil), cache.WithPrefix(p), cache.WithoutNearCache(),
		cache.WithObserver(func(e cache.Event) {
			switch e.Kind {
			case cache.EventNearLeaseWait:
				waits.Add(1)
			case cache.EventNearHit:
				t.Error("a Cache without a near cache served from memory")
			}
		}))
	t.Cleanup(func() { writer.Close() })
	const readers = 3
	kids := make([]*proctest.Child, readers)
	for i := range kids {
		env := map[string]string{"REDIS": px.Addr(), "PREFIX": p, "ROUNDS": strconv.Itoa(rounds)}
		if perKey { // (else as the environment says: upgrade-check.sh sets CHILD_PERKEY for an older parent)
			env["PERKEY"] = "true"
		}
		kids[i] = proctest.Start(t, "near-reader", env)
	}
	for r := range rounds {
		key := "k" + strconv.Itoa(r)
		setRetrying(t, writer, key, "old")
		for _, k := range kids {
			k.Expect(t, "ready", 10*time.Second)
			k.Send(t, "go "+key)
		}
		for _, k := range kids {
			k.Expect(t, "warm", 20*time.Second) // serving from memory
		}
		if stop {
			frozen := kids[r%readers].Process()
			if err := frozen.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.AfterFunc(nearLease/3, func() { _ = frozen.Signal(syscall.SIGCONT) })
		}
		began := time.Now()
		setRetrying(t, writer, key, "new")
		setTimes = append(setTimes, time.Since(began))
		done := time.Now().UnixNano()
		wait := 300 * time.Millisecond // every reader has read again since
		if stop {
			wait += nearLease / 3
		}
		time.Sleep(wait)
		for _, k := range kids {
			k.Send(t, "stop "+strconv.FormatInt(done, 10))
		}
		for _, k := range kids {
			f := strings.Fields(k.Expect(t, "result", 10*time.Second))
			h, _ := strconv.ParseInt(f[1], 10, 64)
			o, _ := strconv.ParseInt(f[2], 10, 64)
			hits, old = hits+h, old+o
		}
	}
	return old, hits, waits.Load(), setTimes
}

// TestMixedNearCacheAcrossProcesses: three reader processes with near
// caches (strict, or strict per key), a writer without one. No read begun
// after Set returned gets the old value; the writer hears every reader's
// acknowledgement (it waits out no lease), and waits for a frozen reader to
// come back and acknowledge.
func TestMixedNearCacheAcrossProcesses(t *testing.T) {
	for _, run := range []struct {
		name         string
		stop, perKey bool
	}{{"none", false, false}, {"stop", true, false}, {"perkey/none", false, true}, {"perkey/stop", true, true}} {
		stop := run.stop
		t.Run(run.name, func(t *testing.T) {
			const rounds = 3
			old, hits, waits, setTimes := mixedRounds(t, rounds, stop, run.perKey)
			t.Logf("%d near hits, %d old reads after Set returned; %d lease waits; Set took %v", hits, old, waits, setTimes)
			if old > 0 {
				t.Errorf("%d reads began after the writer's Set returned and got the old value", old)
			}
			if hits < rounds*3*100 {
				t.Errorf("only %d near hits: memory was not serving", hits)
			}
			if waits != 0 {
				t.Errorf("%d writes waited out a lease with every reader running within it: acknowledgements did not reach the writer", waits)
			}
			if stop {
				for _, d := range setTimes {
					if d < nearLease/3/2 {
						t.Errorf("a Set took %v with a reader frozen for %v: it did not wait for the frozen reader", d, nearLease/3)
					}
				}
			}
		})
	}
}

// lateTracking is a dialer whose tracking connections (those that turn
// client-side caching on) read late: a reader's invalidations land well
// after Redis sent them, so that a write that does not wait for the reader
// is seen to return before the reader dropped the old value.
func lateTracking(delay time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		cn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lateConn{Conn: cn, delay: delay}, nil
	}
}

type lateConn struct {
	net.Conn
	delay    time.Duration
	tracking atomic.Bool
}

func (c *lateConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("TRACKING")) {
		c.tracking.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *lateConn) Read(b []byte) (int, error) {
	if c.tracking.Load() {
		time.Sleep(c.delay)
	}
	return c.Conn.Read(b)
}

// TestClusterMixedNearCache: on a 3-master cluster, a reader with a near
// cache whose invalidations come 20ms late and a writer without one, on
// keys of every master: the writer's marker reaches the reader's
// connection to every master through the bus, its acknowledgement reaches
// the writer's subscription on whatever node it is, and no read after Set
// returned gets the old value.
func TestClusterMixedNearCache(t *testing.T) {
	const masters = 3
	cl := startCluster(t, masters)
	ctx := context.Background()
	p := "mixed" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	addrs := make([]string, len(cl.nodes))
	for i, n := range cl.nodes {
		addrs[i] = n.Addr
	}
	rrdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: lateTracking(20 * time.Millisecond)})
	t.Cleanup(func() { _ = rrdb.Close() })
	var hits atomic.Int64
	reader := cache.New[string](rrdb, cache.WithPrefix(p), cache.WithNearCache(1<<20), cache.WithNearMaxAge(nearMaxAge),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				hits.Add(1)
			}
		}))
	t.Cleanup(func() { reader.Close() })
	var waits atomic.Int64
	writer := cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithoutNearCache(), cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearLeaseWait {
			waits.Add(1)
		}
	}))
	t.Cleanup(func() { writer.Close() })
	load := func(context.Context) (string, error) { return "", cache.ErrNotFound }
	stale, reads := 0, 0
	for r := range 3 {
		for _, k := range keysOnEveryMaster(p, masters, 2) {
			old, next := "v"+strconv.Itoa(r), "v"+strconv.Itoa(r+1)
			if r == 0 {
				setRetrying(t, writer, k, old)
			}
			h0 := hits.Load()
			eventually(t, 10*time.Second, "the old value served from memory", func() bool {
				v, err := reader.GetOrLoad(ctx, k, load)
				return err == nil && v == old && hits.Load() > h0
			})
			setRetrying(t, writer, k, next)
			v, err := reader.GetOrLoad(ctx, k, load)
			if err != nil {
				t.Fatalf("GetOrLoad(%q): %v", k, err)
			}
			reads++
			if v != next {
				stale++
			}
		}
	}
	t.Logf("%d of %d reads after Set returned got the old value; %d lease waits", stale, reads, waits.Load())
	if stale > 0 {
		t.Errorf("%d reads began after the writer's Set returned and got the old value", stale)
	}
	if waits.Load() != 0 {
		t.Errorf("%d writes waited out the reader's lease: acknowledgements did not reach the writer", waits.Load())
	}
}

// BenchmarkMixedWrite is BenchmarkWrite's procs rows for a writer without
// a near cache among processes with one: its writes wait for their
// acknowledgements as a near-cached writer's do.
//
//	go test -run '^$' -bench BenchmarkMixedWrite -benchtime 2000x ./reliability/
func BenchmarkMixedWrite(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("procs=%d", n), func(b *testing.B) { benchWrite(b, n, false, false) })
	}
}
