// This file proves that a Cache's waiters are woken by the holder's
// commit or release instead of their poll, that the subscription never
// costs a notification (commit before the subscribe, or between two waits),
// that a dead or refused subscription falls back to the poll, and that a
// Cache subscribes only to wait; that the breaker keeps GetOrLoad off an
// unreachable Redis and closes when it answers; and that a coalesced read
// on the wire before a Delete answers no caller that began after it. The
// notifier's and the breaker's own tests are in internal/notify and
// internal/health.

package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/notify"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readOrLockHook counts the read-or-lock script calls of a client and calls
// after(n) once the reply to the n-th has come back, before the cache sees
// it.
type readOrLockHook struct {
	n     atomic.Int64
	after func(n int64)
}

func (h *readOrLockHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *readOrLockHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !redistest.IsScript(cmd) || len(cmd.Args()) < 2 || cmd.Args()[1] != readOrLockScript.Hash() {
			return next(ctx, cmd)
		}
		n := h.n.Add(1)
		err := next(ctx, cmd)
		if h.after != nil {
			h.after(n)
		}
		return err
	}
}
func (h *readOrLockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// eventCount counts the events of one kind.
func eventCount(kind EventKind, n *atomic.Int64) Option {
	return WithObserver(func(e Event) {
		if e.Kind == kind {
			n.Add(1)
		}
	})
}

// loadScripts loads the scripts, so that every run is one EVALSHA.
func loadScripts(t *testing.T, rdb *redis.Client) {
	t.Helper()
	for _, s := range []*redis.Script{readOrLockScript, commitScript, unlockScript} {
		require.NoError(t, s.Load(t.Context(), rdb).Err())
	}
}

// notifyBackoff is the waiters' poll interval in these tests: a waiter that
// gets its value well within it was woken (or re-read after subscribing),
// not polled.
const notifyBackoff = 5 * time.Second

// gatedHolder takes key's lock through its own client and Cache, and loads
// once open is called: it returns a product, or fails.
type gatedHolder struct {
	gate chan struct{}
	done chan error
}

func startHolder(t *testing.T, addr, key string, fail bool) *gatedHolder {
	t.Helper()
	h := &gatedHolder{gate: make(chan struct{}), done: make(chan error, 1)}
	rdb := redistest.Client(t, addr)
	c := New[product](rdb, WithRetry(0, 0))
	t.Cleanup(func() { _ = c.Close() })
	go func() {
		_, err := c.GetOrLoad(context.Background(), key, func(ctx context.Context) (product, error) {
			<-h.gate
			if fail {
				return product{}, errors.New("source down")
			}
			return product{ID: "holder"}, nil
		})
		h.done <- err
	}()
	require.Eventually(t, func() bool { return rdb.Exists(t.Context(), LockKey(key)).Val() == 1 },
		10*time.Second, 5*time.Millisecond, "the holder takes the lock")
	return h
}

// open lets the holder load and commit (or release); with wait, it returns
// once the holder has.
func (h *gatedHolder) open(t *testing.T, wait bool) {
	close(h.gate)
	if wait {
		err := <-h.done
		h.done <- err
	}
}

func TestWaiterWokenByHolder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// The holder is let go after the waiter's read-or-lock number at
		// (before the waiter sees its reply; with sync, after the holder
		// committed or released).
		at          int64
		sync        bool
		fail        bool
		wantScripts int64 // the waiter's read-or-lock calls
		wantWoken   int64
	}{
		// 1: held; wait 1 subscribes, confirms, returns; 2: held; wait 2
		// is woken by the commit; 3: the value.
		{name: "commit while waiting", at: 2, wantScripts: 3, wantWoken: 1},
		// The same, with a release: 3 takes the lock, the waiter loads.
		{name: "release after a loader error", at: 2, fail: true, wantScripts: 3, wantWoken: 1},
		// The commit is published before the waiter subscribes: no
		// message, but the re-read after the confirmation finds the value.
		{name: "commit before the subscribe", at: 1, sync: true, wantScripts: 2, wantWoken: 0},
		// The message arrives while the waiter re-reads, between two
		// waits: the next wait returns at once.
		{name: "commit between two waits", at: 2, sync: true, wantScripts: 3, wantWoken: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, p := setup(t)
			loadScripts(t, rdb)
			key := p + "k"
			addr := rdb.Options().Addr
			h := startHolder(t, addr, key, tt.fail)

			wdb := redistest.Client(t, addr)
			hook := &readOrLockHook{after: func(n int64) {
				if n == tt.at {
					h.open(t, tt.sync)
					if tt.sync && tt.at > 1 {
						time.Sleep(50 * time.Millisecond) // the message reaches the subscription first
					}
				}
			}}
			wdb.AddHook(hook)
			var woken atomic.Int64
			c := New[product](wdb, WithRetry(50, notifyBackoff), eventCount(EventWoken, &woken))
			t.Cleanup(func() { _ = c.Close() })
			src := &counter{}

			start := time.Now()
			v, err := c.GetOrLoad(t.Context(), key, src.load)
			took := time.Since(start)
			require.NoError(t, err)
			if herr := <-h.done; tt.fail {
				assert.Error(t, herr, "holder")
			} else {
				assert.NoError(t, herr, "holder")
			}
			if tt.fail {
				assert.Equal(t, "p1", v.ID, "the waiter loads after the release")
				assert.EqualValues(t, 1, src.calls.Load(), "waiter's loads")
			} else {
				assert.Equal(t, "holder", v.ID, "the waiter gets the holder's value")
				assert.Zero(t, src.calls.Load(), "waiter's loads")
			}
			assert.Equal(t, tt.wantScripts, hook.n.Load(), "read-or-lock calls of the waiter")
			assert.Equal(t, tt.wantWoken, woken.Load(), "EventWoken")
			assert.Less(t, took, notifyBackoff*4/5, "a poll would take the %v backoff", notifyBackoff)
		})
	}
}

// TestWaiterPollsWhenSubscriptionDies kills the waiter's subscription
// connection while it waits: it gets the holder's value by polling, and a
// later wait subscribes again and is woken.
func TestWaiterPollsWhenSubscriptionDies(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "the test kills every pub/sub connection of the server")
	admin := redistest.Client(t, srv.Addr)
	loadScripts(t, admin)
	const backoff = 300 * time.Millisecond

	wdb := redistest.Client(t, srv.Addr)
	hook := &readOrLockHook{}
	wdb.AddHook(hook)
	var woken atomic.Int64
	c := New[product](wdb, WithRetry(100, backoff), eventCount(EventWoken, &woken))
	t.Cleanup(func() { _ = c.Close() })

	round := func(key string, kill bool) (scripts, wakes int64) {
		hook.n.Store(0)
		woken.Store(0)
		h := startHolder(t, srv.Addr, key, false)
		hook.after = func(n int64) {
			if n != 2 {
				return
			}
			if kill {
				assert.NoError(t, admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err())
			}
			h.open(t, false)
		}
		v, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
		hook.after = nil
		require.NoError(t, err)
		require.NoError(t, <-h.done)
		assert.Equal(t, "holder", v.ID)
		return hook.n.Load(), woken.Load()
	}

	scripts, wakes := round("dead", true)
	assert.Zero(t, wakes, "EventWoken with the subscription killed")
	assert.GreaterOrEqual(t, scripts, int64(3), "read-or-lock calls: the value comes from a poll")

	time.Sleep(notify.RetryAfter + 100*time.Millisecond) // a broken master is left alone this long
	scripts, wakes = round("again", false)
	assert.EqualValues(t, 1, wakes, "EventWoken on a new subscription")
	assert.EqualValues(t, 3, scripts, "read-or-lock calls")
}

// TestWaiterWokenWithoutShardedPubSub runs against a server without
// SSUBSCRIBE and SPUBLISH, as Redis < 7: the scripts PUBLISH, the notifier
// learns from the error to SUBSCRIBE, and the waiter is woken. On Redis 7
// the sharded commands are renamed away; Redis 6 has none to rename (and
// refuses to rename an unknown command).
func TestWaiterWokenWithoutShardedPubSub(t *testing.T) {
	t.Parallel()
	var args []string
	if v, err := redistest.ServerVersion(); err != nil || v.ShardedPubSub() {
		args = []string{"--rename-command", "SSUBSCRIBE", "", "--rename-command", "SPUBLISH", ""}
	}
	srv := redistest.PrivateServer(t, "the test needs a server without sharded pub/sub (Redis 6)", args...)
	admin := redistest.Client(t, srv.Addr)
	require.Error(t, admin.SPublish(t.Context(), "x", "y").Err(), "SPUBLISH must be unknown")
	loadScripts(t, admin)
	key := "k"
	h := startHolder(t, srv.Addr, key, false)

	wdb := redistest.Client(t, srv.Addr)
	var subscribers int64
	hook := &readOrLockHook{after: func(n int64) {
		if n == 2 {
			subscribers = admin.PubSubNumSub(t.Context(), notify.Channel("", key)).Val()[notify.Channel("", key)]
			h.open(t, false)
		}
	}}
	wdb.AddHook(hook)
	var woken atomic.Int64
	c := New[product](wdb, WithRetry(50, notifyBackoff), eventCount(EventWoken, &woken))
	t.Cleanup(func() { _ = c.Close() })

	start := time.Now()
	v, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.NoError(t, err)
	require.NoError(t, <-h.done)
	assert.Equal(t, "holder", v.ID)
	assert.EqualValues(t, 1, subscribers, "SUBSCRIBE subscribers of the key's channel")
	assert.EqualValues(t, 1, woken.Load(), "EventWoken")
	assert.EqualValues(t, 3, hook.n.Load(), "read-or-lock calls")
	assert.Less(t, time.Since(start), notifyBackoff*4/5)
}

// TestNoSubscriptionWithoutAWait: a miss and a hit open no pub/sub
// connection on the Cache's client; the notifier subscribes on a first wait.
func TestNoSubscriptionWithoutAWait(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	name := p + "client" // the near cache's connections have a name of their own
	cdb := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, ClientName: name})
	t.Cleanup(func() { _ = cdb.Close() })
	c := New[product](cdb)
	t.Cleanup(func() { _ = c.Close() })
	for range 2 { // a miss, then a hit
		v, err := c.GetOrLoad(t.Context(), p+"a", (&counter{}).load)
		require.NoError(t, err)
		require.Equal(t, "p1", v.ID)
	}
	conns, subscribed := 0, 0
	for _, line := range strings.Split(rdb.ClientList(t.Context()).Val(), "\n") {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		conns++
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "flags=") && strings.Contains(f, "P") {
				subscribed++
			}
		}
	}
	require.Positive(t, conns, "connections of the Cache's client")
	assert.Zero(t, subscribed, "pub/sub connections after a miss and a hit")
}

// pubsubProxy forwards TCP connections to a Redis and can black-hole the
// pub/sub ones (those whose client sent a subscribe) without closing them,
// as a half-open connection does.
type pubsubProxy struct {
	l  net.Listener
	mu sync.Mutex
	cs []*proxied // protected by mu
	wg sync.WaitGroup
}

type proxied struct {
	client, server net.Conn
	pubsub, frozen atomic.Bool
}

func newPubsubProxy(t *testing.T, upstream string) *pubsubProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pubsubProxy{l: l}
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			pc := &proxied{client: c, server: s}
			p.mu.Lock()
			p.cs = append(p.cs, pc)
			p.mu.Unlock()
			p.wg.Go(func() { pc.pipe(c, s, true) })
			p.wg.Go(func() { pc.pipe(s, c, false) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, pc := range p.cs {
			pc.client.Close()
			pc.server.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (pc *proxied) pipe(from, to net.Conn, fromClient bool) {
	defer to.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		if fromClient && strings.Contains(strings.ToLower(string(buf[:n])), "subscribe") {
			pc.pubsub.Store(true)
		}
		if pc.frozen.Load() {
			continue // swallowed
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}

// freeze black-holes the pub/sub connections open now.
func (p *pubsubProxy) freeze() (n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.cs {
		if pc.pubsub.Load() {
			pc.frozen.Store(true)
			n++
		}
	}
	return n
}

// TestWaiterPollsWhenSubscriptionHangs black-holes the subscription's
// connection without closing it: waiters poll, a PING that gets no answer
// breaks the subscription, and a later wait is woken on a new one.
func TestWaiterPollsWhenSubscriptionHangs(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	loadScripts(t, rdb)
	proxy := newPubsubProxy(t, rdb.Options().Addr)
	const backoff = 200 * time.Millisecond

	wdb := redistest.Client(t, proxy.l.Addr().String())
	hook := &readOrLockHook{}
	wdb.AddHook(hook)
	var woken atomic.Int64
	c := New[product](wdb, WithRetry(100, backoff), eventCount(EventWoken, &woken), WithoutNearCache()) // counts subscribed connections
	t.Cleanup(func() { _ = c.Close() })

	round := func(key string) (wakes int64) {
		woken.Store(0)
		h := startHolder(t, rdb.Options().Addr, key, false)
		hook.after = func(n int64) {
			if n == 2 {
				h.open(t, false)
			}
		}
		hook.n.Store(0)
		v, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
		hook.after = nil
		require.NoError(t, err)
		require.NoError(t, <-h.done)
		assert.Equal(t, "holder", v.ID)
		return woken.Load()
	}
	require.EqualValues(t, 1, round(p+"before"), "EventWoken before the connection hangs")
	// Counted by the server, not by the proxy: on Redis 6 the notifier's
	// first subscribe (SSUBSCRIBE) is refused and its connection closed, and
	// the proxy still lists that closed connection. A refused connection left
	// open would be counted here (the server lists it, with no channel).
	subscribed := func() (n int) {
		proxy.mu.Lock()
		defer proxy.mu.Unlock()
		for _, line := range strings.Split(rdb.ClientList(t.Context()).Val(), "\n") {
			for _, pc := range proxy.cs {
				if pc.pubsub.Load() && strings.Contains(line, " addr="+pc.server.LocalAddr().String()+" ") {
					n++
				}
			}
		}
		return n
	}
	require.Equal(t, 1, subscribed(), "open connections through the proxy that sent a subscribe, as the server lists them")
	require.GreaterOrEqual(t, proxy.freeze(), 1, "pub/sub connections frozen")
	assert.Zero(t, round(p+"frozen"), "EventWoken while the connection hangs")

	// More timed-out waits probe the connection and break it; after
	// notify.RetryAfter a new subscription is made.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if round(p+"after"+strconv.Itoa(i)) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no waiter woken 10s after the subscription hung: it was never replaced")
		}
	}
}

// TestSubscriptionSurvivesASlowDial: a new subscription's dial slower than
// the waiter's backoff does not kill it: the subscribe has a
// deadline of its own, so the waiter is woken by the holder's commit
// instead of polling while the master is backed off.
func TestSubscriptionSurvivesASlowDial(t *testing.T) {
	t.Parallel()
	rdb, key := setup(t)
	key += "k"
	const dialDelay, backoff = 400 * time.Millisecond, 100 * time.Millisecond
	var dials atomic.Int64
	slow := redis.NewClient(&redis.Options{
		Addr: rdb.Options().Addr,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			select { // a loaded machine: the dial plus the handshake take longer than a backoff
			case <-time.After(dialDelay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	defer slow.Close()
	var woken atomic.Int64
	c := New[product](slow, WithRetry(100, backoff), eventCount(EventWoken, &woken), WithoutNearCache()) // counts dials
	defer c.Close()
	// A poll (every 100 ms) may read the committed value before the
	// notification is handled, on a loaded machine: up to three waits, one
	// of which must be woken.
	for i := 0; i < 3 && woken.Load() == 0; i++ {
		k := fmt.Sprintf("%s%d", key, i)
		h := startHolder(t, rdb.Options().Addr, k, false)
		got := make(chan product, 1)
		go func() {
			v, err := c.GetOrLoad(context.Background(), k, (&counter{}).load)
			assert.NoError(t, err)
			got <- v
		}()
		waitFor(t, func() bool { // subscribed: the server counts a subscriber of the key's channel
			ch := notify.Channel("", k) // SSUBSCRIBE, or SUBSCRIBE on Redis < 7 (where SHARDNUMSUB fails: 0)
			return rdb.PubSubShardNumSub(t.Context(), ch).Val()[ch]+rdb.PubSubNumSub(t.Context(), ch).Val()[ch] == 1
		})
		h.open(t, false)
		assert.Equal(t, "holder", (<-got).ID)
	}
	assert.Equal(t, int64(1), woken.Load(), "woken by the commit, not by polling")
	wantDials := int64(2) // the flight's connection and the subscription's, once
	if v, err := redistest.ServerVersion(); err == nil && !v.ShardedPubSub() {
		wantDials = 3 // and the SUBSCRIBE connection after SSUBSCRIBE was refused (Redis 6)
	}
	assert.Equal(t, wantDials, dials.Load(), "dials")
}

func TestBreakerSkipsAnUnreachableRedis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		opts      []Option
		breaker   bool
		policy    FailurePolicy
		wantError error
	}{
		{"default, fail open", nil, true, FailOpen, nil},
		{"default, fail closed", nil, true, FailClosed, ErrCircuitOpen},
		{"off", []Option{WithoutCircuitBreaker()}, false, FailOpen, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb, _ := dialCounter(t, deadAddr(t))
			cmds := redistest.CountCommands(rdb)
			start := time.Now()
			var events [EventBreakerClose + 1]atomic.Int64
			opts := append([]Option{WithFailurePolicy(tc.policy), WithObserver(func(e Event) { events[e.Kind].Add(1) })}, tc.opts...)
			c := New[product](rdb, opts...)
			src := &counter{}
			var errs int
			for i := range 200 {
				_, err := c.GetOrLoad(t.Context(), "k"+string(rune('a'+i%26)), src.load)
				if err != nil {
					errs++
					if tc.wantError != nil && i >= 10 {
						require.ErrorIs(t, err, tc.wantError)
					}
				}
			}
			if tc.policy == FailOpen {
				assert.Zero(t, errs)
				assert.Equal(t, int64(200), src.calls.Load(), "fail open loads each call, uncached")
			} else {
				assert.Equal(t, 200, errs)
				assert.Zero(t, src.calls.Load())
			}
			sent := cmds.Count("get")
			if tc.breaker {
				// 5 failures open it; then one probe per 1s cool-down.
				probes := int(time.Since(start)/DefaultBreakerCoolDown) + 1
				assert.LessOrEqual(t, sent, DefaultBreakerFailures+probes, "an open breaker must keep calls off the dead Redis")
				assert.Equal(t, int64(1), events[EventBreakerOpen].Load())
			} else {
				assert.Equal(t, 200, sent, "without the breaker every call tries Redis")
			}
		})
	}
}

func TestBreakerClosesWhenRedisAnswersAgain(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "k"
	addr := freeAddr(t)
	rdb, dials := dialCounter(t, addr)
	var closed atomic.Int64
	c := New[product](rdb, WithCircuitBreaker(2, 50*time.Millisecond), WithObserver(func(e Event) {
		if e.Kind == EventBreakerClose {
			closed.Add(1)
		}
	}))
	defer c.Close()
	src := &counter{}
	for range 20 {
		_, err := c.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
	}
	assert.True(t, c.brk.Open())
	before := dials.Load()

	// Redis comes back at the same address: a proxy to the test Redis.
	redistest.ProxyAt(t, addr, redistest.Addr(t))
	waitFor(t, func() bool {
		_, err := c.GetOrLoad(t.Context(), key, src.load)
		return err == nil && !c.brk.Open()
	})
	assert.Greater(t, dials.Load(), before, "the probe must reach Redis")
	assert.Equal(t, int64(1), closed.Load())
	n := src.calls.Load()
	for range 5 {
		_, err := c.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, src.calls.Load(), n+1, "with Redis back the value is cached again")
}

// TestLostLockIsNotAnOutage: a release that finds its lock gone got a reply
// from Redis; counted as an outage it opened the breaker and logged Redis as
// unreachable (what made memory pressure, which evicts locks, look like an
// outage).
func TestLostLockIsNotAnOutage(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	logs := &logCapture{}
	c := New[product](rdb, WithCircuitBreaker(1, time.Minute), WithLogger(slog.New(logs)))
	defer c.Close()
	key := p + "k"
	_, err := c.GetOrLoad(t.Context(), key, func(ctx context.Context) (product, error) {
		require.NoError(t, rdb.Del(ctx, LockKey(key)).Err()) // evicted, or voided by a Delete
		return product{}, assert.AnError
	})
	require.ErrorIs(t, err, assert.AnError)
	assert.False(t, c.brk.Open(), "a lost lock opened the breaker")
	assert.Zero(t, logs.count(), "a lost lock was logged as an outage: %q", logs.lines(slog.LevelError))
}

// queued waits until n of c's reads wait for the next batch.
func queued[V any](t *testing.T, c *Cache[V], n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := c.redisio.Queued()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued; want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBatchInFlightDoesNotServeLaterCallers: an MGET ran on the server (its
// reply not yet back) before a Delete; a Get and a GetOrLoad that begin
// after the Delete returned must not be answered by it.
func TestBatchInFlightDoesNotServeLaterCallers(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	lead, key := p+"lead", p+"item"
	addr := redistest.Addr(t)
	rdbA := redistest.Client(t, addr)
	// The gate goes on before a exists: a's near cache uses rdbA at once, and
	// go-redis may not allow adding a hook to a client in use.
	gate := redistest.NewReadGate()
	rdbA.AddHook(gate)
	a := New[string](rdbA)
	b := New[string](redistest.Client(t, addr))
	require.NoError(t, b.Set(t.Context(), lead, "lead"))
	require.NoError(t, b.Set(t.Context(), key, "v0"))

	var wg sync.WaitGroup
	var firstV, laterV string
	var firstErr, laterErr, getErr error
	wg.Go(func() {
		_, _ = a.GetOrLoad(t.Context(), lead, func(context.Context) (string, error) { return "", nil })
	})
	gate.Next(t) // lead's GET on the wire
	wg.Go(func() {
		firstV, firstErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { panic("loaded") })
	})
	queued(t, a, 1)
	gate.Release()
	require.Equal(t, []string{key}, gate.Next(t)) // the MGET ran and found v0
	require.NoError(t, b.Delete(t.Context(), key))

	wg.Go(func() { _, getErr = a.Get(t.Context(), key) })
	wg.Go(func() {
		laterV, laterErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	queued(t, a, 1) // Get's read waits for the next batch; GetOrLoad joined the flight
	gate.Open()
	wg.Wait()

	require.NoError(t, firstErr)
	assert.Equal(t, "v0", firstV, "the caller that began before the Delete")
	assert.ErrorIs(t, getErr, ErrCacheMiss, "a Get that began after the Delete returned")
	require.NoError(t, laterErr)
	assert.Equal(t, "v2", laterV, "a GetOrLoad that began after the Delete returned")
}
