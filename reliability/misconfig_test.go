// This file checks what FailOpen must not hide and what an outage
// may cost: a Redis that answers "no" (wrong or missing
// password, a user without permission, a command renamed away) is a
// misconfiguration, returned under every policy; a Redis that does not answer
// at all opens the circuit breaker, so that calls stop paying for it.
package reliability_test

import (
	"context"
	"errors"
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

var policies = []struct {
	name string
	p    cache.FailurePolicy
}{{"FailOpen", cache.FailOpen}, {"FailClosed", cache.FailClosed}}

func TestMisconfigurationIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	withPassword := redistest.NewServer(t)
	// Set after the start: redistest pings the server without a password.
	if err := newClient(t, withPassword.Addr, nil).ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatalf("CONFIG SET requirepass: %v", err)
	}
	acl := redistest.NewServer(t)
	admin := newClient(t, acl.Addr, nil)
	for _, user := range [][]any{
		{"ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-@scripting"}, // GET works, EVALSHA does not
		{"ACL", "SETUSER", "otherkeys", "on", ">pw", "~other:*", "+@all"},          // no access to the cache's keys
	} {
		if err := admin.Do(ctx, user...).Err(); err != nil {
			t.Fatalf("%v: %v", user, err)
		}
	}
	noScripts := redistest.NewServer(t, "--rename-command", "EVALSHA", "", "--rename-command", "EVAL", "")
	cases := []struct {
		name, addr string
		tune       func(*redis.Options)
		want       string // in the error
	}{
		{"wrong-password", withPassword.Addr, func(o *redis.Options) { o.Password = "wrong" }, "WRONGPASS"},
		{"no-password", withPassword.Addr, nil, "NOAUTH"},
		{"user-without-scripting", acl.Addr, func(o *redis.Options) { o.Username, o.Password = "noscripts", "pw" }, "NOPERM"},
		{"user-without-key-access", acl.Addr, func(o *redis.Options) { o.Username, o.Password = "otherkeys", "pw" }, "NOPERM"},
		{"scripts-renamed-away", noScripts.Addr, nil, "unknown command"},
	}
	for _, tc := range cases {
		for _, pol := range policies {
			t.Run(tc.name+"/"+pol.name, func(t *testing.T) {
				c := cache.New[string](newClient(t, tc.addr, tc.tune), cache.WithFailurePolicy(pol.p))
				src := newSource(0)
				const calls = 10
				var errs int
				var first error
				for i := range calls {
					k := "misconfig:" + strconv.Itoa(i)
					v, err := c.GetOrLoad(ctx, k, src.loader(k, "v"))
					if err == nil {
						t.Errorf("GetOrLoad(%q) = %q, nil; want an error containing %q", k, v, tc.want)
						continue
					}
					errs++
					if first == nil {
						first = err
					}
					if !strings.Contains(err.Error(), tc.want) {
						t.Errorf("GetOrLoad(%q) = %v; want an error containing %q", k, err, tc.want)
					}
				}
				if n := src.total.Load(); n != 0 {
					t.Errorf("loads = %d; want 0: a misconfigured Redis must not turn into uncached loads", n)
				}
				t.Logf("figures: %s, %s: %d calls: %d errors, %d loads; first error: %v",
					tc.name, pol.name, calls, errs, src.total.Load(), first)
			})
		}
	}
}

// refusedFast is fastFail with one quick dial retry (go-redis retries a
// refused dial 5 times, 100ms apart, by default).
func refusedFast(o *redis.Options) {
	fastFail(o)
	o.DialerRetries, o.DialerRetryTimeout = 1, 10*time.Millisecond
}

// TestCircuitBreakerDuringOutage kills Redis (its port refuses connections)
// and makes 200 calls on distinct keys with the default breaker's failure
// count and a short cool-down: after the first few failures the cache must
// stop sending commands to Redis. When Redis is back, a probe closes the
// breaker and values are cached again.
func TestCircuitBreakerDuringOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, pol := range policies {
		t.Run(pol.name, func(t *testing.T) {
			t.Parallel() // each kills its own server
			srv := redistest.NewServer(t)
			rdb := newClient(t, srv.Addr, refusedFast)
			hook := redistest.CountCommands(rdb)
			const coolDown = 250 * time.Millisecond // the default (1s) costs the test seconds, not coverage
			c := cache.New[string](rdb, cache.WithFailurePolicy(pol.p), cache.WithCircuitBreaker(cache.DefaultBreakerFailures, coolDown))
			src := newSource(0)
			if _, err := c.GetOrLoad(ctx, "breaker:warm", src.loader("breaker:warm", "v")); err != nil {
				t.Fatalf("before the outage: %v", err)
			}
			srv.Kill()
			hook.Reset()
			before := src.total.Load()

			const calls = 200
			var ok, circuitOpen, otherErrs int
			var firstOther error
			start := time.Now()
			for i := range calls {
				if time.Since(start) > 60*time.Second {
					t.Errorf("gave up after %d calls in %v", i, time.Since(start).Round(time.Millisecond))
					break
				}
				k := "breaker:" + strconv.Itoa(i)
				v, err := c.GetOrLoad(ctx, k, src.loader(k, "v:"+k))
				switch {
				case err == nil && v == "v:"+k:
					ok++
				case errors.Is(err, cache.ErrCircuitOpen):
					circuitOpen++
				default:
					otherErrs++
					if firstOther == nil {
						firstOther = err
					}
				}
			}
			took := time.Since(start)
			cmds, dials, loads := hook.Total(), hook.Dials(), src.total.Load()-before
			if cmds > 10 {
				t.Errorf("%d calls during the outage sent %d commands to Redis (%d dials); want at most 10", calls, cmds, dials)
			}
			switch pol.p {
			case cache.FailOpen:
				if ok != calls || loads != calls {
					t.Errorf("FailOpen: %d of %d calls got their value, %d loads; want all from the loader (first error: %v)", ok, calls, loads, firstOther)
				}
			case cache.FailClosed:
				if loads != 0 || ok != 0 {
					t.Errorf("FailClosed: %d loads, %d ok; want none", loads, ok)
				}
				if circuitOpen < calls-10 {
					t.Errorf("FailClosed: %d of %d calls got ErrCircuitOpen; want all but the first few (first other error: %v)", circuitOpen, calls, firstOther)
				}
			}
			t.Logf("figures: Redis down, %s, %d calls on distinct keys: %d ok, %d ErrCircuitOpen, %d other errors, %d loads; Redis commands sent=%d, dials=%d; %v in all, %v per call",
				pol.name, calls, ok, circuitOpen, otherErrs, loads, cmds, dials, took.Round(time.Millisecond), (took / calls).Round(time.Microsecond))

			// A longer outage: 8 workers calling every 10ms for 4 cool-downs
			// may send one probe per cool-down.
			hook.Reset()
			var sustained atomic.Int64
			var wg sync.WaitGroup
			const outage = 4 * coolDown
			const probesAllowed = 6 // one at the start, one per cool-down, plus one for timer slack
			for w := range 8 {
				wg.Go(func() {
					for start := time.Now(); time.Since(start) < outage; {
						k := "breaker:long:" + strconv.Itoa(w) + ":" + strconv.FormatInt(sustained.Add(1), 10)
						_, _ = c.GetOrLoad(ctx, k, src.loader(k, "v"))
						time.Sleep(10 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			if n := hook.Total(); n > probesAllowed {
				t.Errorf("%d calls over a %v outage sent %d commands; want at most %d (one probe per %v cool-down)", sustained.Load(), outage, n, probesAllowed, coolDown)
			}
			t.Logf("figures: %s: %d more calls from 8 goroutines over %v of outage sent %d commands (probes)", pol.name, sustained.Load(), outage, hook.Total())

			if err := srv.Start(); err != nil {
				t.Fatalf("restart redis: %v", err)
			}
			back := time.Now()
			direct := newClient(t, srv.Addr, nil)
			k := "breaker:back"
			recovered := eventually(t, 10*time.Second, "value cached again after Redis is back", func() bool {
				_, _ = c.GetOrLoad(ctx, k, src.loader(k, "v"))
				return stored(t, direct, k) == `"v"`
			})
			n := src.loads(k)
			if v, err := c.GetOrLoad(ctx, k, src.loader(k, "v")); err != nil || v != "v" || src.loads(k) != n {
				t.Errorf("after recovery: GetOrLoad = %q, %v with %d new loads; want a hit", v, err, src.loads(k)-n)
			}
			t.Logf("figures: %s: cached again %v after Redis came back (%v polled)", pol.name, time.Since(back).Round(time.Millisecond), recovered.Round(time.Millisecond))
		})
	}
}

// TestClientOnAReplicaNamesREADONLY points a client at a read-only replica,
// as a wrong address in a config does: GET works, every script gets
// READONLY. The cache waits READONLY out as a failover in progress, which is
// fair, but when it gives up the caller must learn why.
func TestClientOnAReplicaNamesREADONLY(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := redistest.NewServer(t, "--repl-diskless-sync-delay", "0") // the replica syncs at once
	replica := redistest.NewServer(t)
	rdb := newClient(t, replica.Addr, nil)
	if err := rdb.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(primary.Port)).Err(); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
	eventually(t, 10*time.Second, "replica in sync", func() bool {
		return strings.Contains(rdb.Info(ctx, "replication").Val(), "master_link_status:up")
	})
	for _, pol := range policies {
		t.Run(pol.name, func(t *testing.T) {
			const loadTimeout = 2 * time.Second
			c := cache.New[string](rdb, cache.WithFailurePolicy(pol.p), cache.WithLoadTimeout(loadTimeout))
			src := newSource(0)
			start := time.Now()
			v, err := c.GetOrLoad(ctx, "on-replica", src.loader("on-replica", "v"))
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "READONLY") {
				t.Errorf("GetOrLoad on a replica = %q, %v after %v; want an error naming READONLY", v, err, took.Round(time.Millisecond))
			}
			t.Logf("figures: client on a replica, %s, load timeout %v: err=%v, loads=%d, after %v",
				pol.name, loadTimeout, err, src.total.Load(), took.Round(time.Millisecond))
		})
	}
}

// TestPlainClientOnAClusterNode gives the cache a *redis.Client of one node
// of a Redis Cluster, as a config that lists one address does: every key
// another node serves gets MOVED, which go-redis follows only in a
// ClusterClient. For this client MOVED never goes away, so the cache must
// return it at once, not poll it for the whole load timeout.
func TestPlainClientOnAClusterNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := startCluster(t, 3)
	rdb := newClient(t, cl.nodes[0].Addr, nil)
	hook := redistest.CountCommands(rdb)
	key, local := "", ""
	for i := 0; key == "" || local == ""; i++ {
		switch k := "moved:" + strconv.Itoa(i); {
		case slot(k) >= 16384/3: // served by another node than 0
			key = k
		case slot(k) < 16384/3-1:
			local = k
		}
	}
	for _, pol := range policies {
		t.Run(pol.name, func(t *testing.T) {
			c := cache.New[string](rdb, cache.WithFailurePolicy(pol.p), cache.WithLoadTimeout(2*time.Second))
			t.Cleanup(func() { _ = c.Close() })
			src := newSource(0)
			// A key node 0 serves works, and sets up what a first call sets
			// up (the notifier's subscription), so that the count below is
			// the MOVED call's own.
			if _, err := c.GetOrLoad(ctx, local, src.loader(local, "v")); err != nil {
				t.Fatalf("GetOrLoad of a key node 0 serves: %v", err)
			}
			hook.Reset()
			start := time.Now()
			v, err := c.GetOrLoad(ctx, key, src.loader(key, "v"))
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "MOVED") {
				t.Errorf("GetOrLoad on the wrong node = %q, %v; want an error naming MOVED", v, err)
			}
			if n := hook.Total(); n > 5 {
				t.Errorf("%d commands sent before the error; want a handful, not a poll until the load timeout", n)
			}
			if n := src.loads(key); n != 0 {
				t.Errorf("loads of the key = %d; want 0: a misconfiguration is no outage", n)
			}
			t.Logf("figures: plain client on a cluster node, %s, load timeout 2s: err=%v, loads=%d, %d commands, after %v",
				pol.name, err, src.loads(key), hook.Total(), took.Round(time.Millisecond))
		})
	}
}

// TestCircuitBreakerOnAStalledLink is the outage where packets vanish
// instead of being refused: each failing call costs the client's read
// timeout (300ms here), so the breaker must open after a few of them.
func TestCircuitBreakerOnAStalledLink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := redistest.Addr(t)
	for _, pol := range policies {
		t.Run(pol.name, func(t *testing.T) {
			t.Parallel() // each stalls its own proxy
			px := newProxy(t, addr)
			rdb := newClient(t, px.Addr(), fastFail)
			hook := redistest.CountCommands(rdb)
			c := cache.New[string](rdb, cache.WithFailurePolicy(pol.p), cache.WithoutNearCache()) // it counts the commands calls send
			t.Cleanup(func() { _ = c.Close() })
			p := redistest.Prefix(t, newClient(t, addr, nil))
			src := newSource(0)
			if _, err := c.GetOrLoad(ctx, p+"warm", src.loader(p+"warm", "v")); err != nil {
				t.Fatalf("before the stall: %v", err)
			}
			px.add(t, "stall", "timeout", "downstream", `{"timeout":0}`)
			hook.Reset()
			before := src.total.Load()
			const calls = 200
			var ok, open, done int
			start := time.Now()
			for i := range calls {
				if time.Since(start) > 20*time.Second {
					break
				}
				k := p + strconv.Itoa(i)
				v, err := c.GetOrLoad(ctx, k, src.loader(k, "v"))
				done++
				switch {
				case err == nil && v == "v":
					ok++
				case errors.Is(err, cache.ErrCircuitOpen):
					open++
				}
			}
			took := time.Since(start)
			px.remove(t, "stall")
			if done != calls {
				t.Errorf("only %d of %d calls returned within 20s of stall", done, calls)
			}
			if n := hook.Total(); n > 15 {
				t.Errorf("%d calls on a stalled link sent %d commands; want at most 15", done, n)
			}
			if pol.p == cache.FailOpen && ok != done {
				t.Errorf("FailOpen: %d of %d calls got their value", ok, done)
			}
			if pol.p == cache.FailClosed && open < done-10 {
				t.Errorf("FailClosed: %d of %d calls got ErrCircuitOpen; want all but the first few", open, done)
			}
			t.Logf("figures: stalled link, %s: %d calls in %v: %d ok, %d ErrCircuitOpen, loads=%d, %d commands sent",
				pol.name, done, took.Round(time.Millisecond), ok, open, src.total.Load()-before, hook.Total())
		})
	}
}
