// This file tests strict coherence through a Cache, piece by piece
// (internal/coherence tests the tracker alone): a process without a lease
// serves nothing, a holder that does not acknowledge is waited for until its
// lease ends, a lost registry makes writes wait out one lease, Close gives
// the lease back, and the registry and marker keys are reserved. The whole
// is attacked across OS processes in the reliability module.

package cache

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serverMillis is the Redis server's clock, as the scripts read it.
func serverMillis(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(t.Context()).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// limitedClient is a client of a private server, logged in as a user who
// may do everything but what deny takes away (say "-hset"), then what it
// gives back ("-client", "+client|id").
func limitedClient(t *testing.T, deny ...string) *redis.Client {
	t.Helper()
	srv := redistest.PrivateServer(t, "it creates an ACL user")
	admin := redistest.Client(t, srv.Addr)
	args := []any{"ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all"}
	for _, d := range deny {
		args = append(args, d)
	}
	require.NoError(t, admin.Do(t.Context(), args...).Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limited", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// A process whose lease cannot be renewed (here its ACL user may not HSET,
// which the renewal script does) reads through Redis and never from memory,
// and says so once in its log.
func TestNearCacheWithoutLeaseServesNothing(t *testing.T) {
	t.Parallel()
	rdb := limitedClient(t, "-hset")
	ev := &events{}
	logs := &logCapture{}
	c := New[product](rdb, WithPrefix("nl:"), ev.option(), WithLogger(slog.New(logs)))
	defer c.Close()
	require.True(t, eventually(func() bool { return c.near.track.Sure() }), "never sure of its invalidations")
	src := &counter{}
	for range 200 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		time.Sleep(time.Millisecond) // past several renewal attempts
	}
	assert.Zero(t, ev.get(EventNearHit), "near hits without a lease")
	assert.Equal(t, int64(1), src.calls.Load(), "reads went to Redis and found the value")
	lines := logs.lines(slog.LevelError)
	require.Len(t, lines, 1, "one report for every failed renewal: %q", lines)
	assert.Contains(t, lines[0], "near cache not serving")
	assert.Contains(t, lines[0], "the lease script") // the refusal itself is worded differently by each Redis
}

// TestNearCacheServesUnderANarrowClientRule: a security review narrows
// +@all to the CLIENT subcommands the near cache needs (ID, TRACKING); the
// tracking connection's name (CLIENT SETNAME) is refused, which must not
// keep the near cache from serving.
func TestNearCacheServesUnderANarrowClientRule(t *testing.T) {
	t.Parallel()
	rdb := limitedClient(t, "-client", "+client|id", "+client|tracking")
	ev := &events{}
	c := New[product](rdb, WithPrefix("nc:"), ev.option())
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }), "the near cache never served under -client +client|id +client|tracking")
	src := &counter{}
	for range 10 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	assert.Positive(t, ev.get(EventNearHit), "reads served from memory (none when the connection setup fails)")
}

// A listed holder that never acknowledges (one registered by hand) is waited
// for until its lease ends, without an error; a ctx that ends first gets an
// error that says the value was written.
func TestWriteWaitsOutASilentHolder(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	ev := &events{}
	c := New[product](rdb, WithPrefix(p), ev.option())
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }))
	lease := 400 * time.Millisecond
	require.NoError(t, rdb.HSet(t.Context(), coherence.RegistryKey(p), "silent", serverMillis(t, rdb)+lease.Milliseconds()).Err())

	began := time.Now()
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "a"}))
	assert.GreaterOrEqual(t, time.Since(began), lease/2, "Set returned long before the silent holder's lease ended")
	assert.Equal(t, int64(1), ev.get(EventNearLeaseWait))

	require.NoError(t, rdb.HSet(t.Context(), coherence.RegistryKey(p), "silent", serverMillis(t, rdb)+10_000).Err())
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := c.Delete(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "written, but near caches not confirmed")
	assert.Zero(t, rdb.Exists(t.Context(), p+"k").Val(), "the Delete itself was done")
}

// A writer whose own acknowledgement channel is not subscribed yet (a Cache
// just created, its tracking connection still dialing) loses the holders'
// first acknowledgements; it asks again (the marker, republished after the
// write) as soon as its subscription is confirmed, neither waiting out their
// leases nor the quarter lease of its timed asks.
func TestWriterAsksAgainForLostAcknowledgements(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	// Leases so long that the writer's first timed ask (a quarter lease, 5 s)
	// comes after the Set's deadline below: only the ask made when its
	// subscription is confirmed (400 ms) gets the write confirmed in time.
	const leaseLen = 20 * time.Second
	r, _, _ := newNearCache(t, p, WithNearLease(leaseLen))
	src := &counter{}
	require.True(t, eventually(func() bool { // the old value in r's memory
		_, err := r.GetOrLoad(t.Context(), "k", src.load)
		return err == nil && nearHas(r, "k")
	}))
	// A registry older than a lease, or the write waits out one lease
	// whatever the acknowledgements (see TestLostRegistryMakesWritesWaitOneLease).
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-leaseLen.Milliseconds()).Err())
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), OnConnect: func(ctx context.Context, cn *redis.Conn) error {
		if name, _ := cn.ClientGetName(ctx).Result(); name == "stampede-near" {
			time.Sleep(400 * time.Millisecond) // the writer's tracking connection comes late
		}
		return nil
	}})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Ping(t.Context()).Err())
	wev := &events{}
	w := New[product](rdb, WithPrefix(p), WithNearCache(1<<20), WithNearLease(leaseLen), wev.option())
	defer w.Close()
	require.False(t, w.near.track.Sure(), "the test wants the write made before the writer's subscription")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	require.NoError(t, w.Set(ctx, "k", product{ID: "v1"}), "not confirmed before the writer's first timed ask")
	assert.Zero(t, wev.get(EventNearLeaseWait), "the writer waited out a running holder's lease: its lost acknowledgement was not asked for again")
	got, err := r.GetOrLoad(t.Context(), "k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "v1", got.ID, "the reader's memory served the old value after Set returned")
}

// Two processes' caches (two clients): writes are acknowledged, not waited
// out, and the other cache's memory never serves a value after a write of
// it returned.
func TestWritesAreAcknowledged(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	w, _, wev := newNearCache(t, p)
	r, _, rev := newNearCache(t, p)
	src := &counter{}
	for i := range 50 {
		_, err := r.GetOrLoad(t.Context(), "k", src.load) // in memory (after the first)
		require.NoError(t, err)
		want := product{ID: "v" + string(rune('a'+i%26))}
		require.NoError(t, w.Set(t.Context(), "k", want))
		got, err := r.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		require.Equal(t, want.ID, got.ID, "round %d: the other cache served the old value after Set returned", i)
	}
	assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out a running holder's lease")
	assert.Positive(t, rev.get(EventNearHit))
}

// A registry created within a lease (here deleted, as FLUSHALL or an
// eviction would) may have forgotten running leases: the next write waits
// one lease from its creation.
func TestLostRegistryMakesWritesWaitOneLease(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	lease := 400 * time.Millisecond
	c := New[product](rdb, WithPrefix(p), WithNearLease(lease))
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }))
	time.Sleep(lease) // the registry is older than a lease
	began := time.Now()
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "a"}))
	quick := time.Since(began)

	require.NoError(t, rdb.Del(t.Context(), coherence.RegistryKey(p)).Err())
	began = time.Now()
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "b"}))
	assert.GreaterOrEqual(t, time.Since(began), lease/2, "Set after the registry was lost (the first took %v)", quick)
}

// Close gives the lease back: writers no longer list the closed holder.
func TestCloseResigns(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithPrefix(p))
	require.True(t, eventually(func() bool { return nearReady(c) }))
	id := c.near.track.ID()
	require.True(t, eventually(func() bool { return rdb.HExists(t.Context(), coherence.RegistryKey(p), id).Val() }), "never registered")
	require.NoError(t, c.Close())
	assert.False(t, rdb.HExists(t.Context(), coherence.RegistryKey(p), id).Val(), "a closed cache still holds its lease")
}

// A Cache closing while another process writes acknowledges the writes
// that still counted on it (their registry read came before it gave its
// lease back) instead of leaving them to wait out its lease: Close gives
// the lease back first, takes in the markers sent before with a PING, and
// acknowledges them before it closes its connections.
func TestCloseDuringWritesIsNotWaitedOut(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	// Leases long enough that a write waiting one out would outlast the
	// writers' 3 s deadline below.
	const leaseLen = 10 * time.Second
	w, _, wev := newNearCache(t, p, WithNearLease(leaseLen))
	// A registry older than a lease, or every write waits one out.
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-leaseLen.Milliseconds()).Err())
	src := &counter{}
	for round := range 5 {
		r, _, _ := newNearCache(t, p, WithNearLease(leaseLen))
		_, err := r.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		var wg sync.WaitGroup
		var writes atomic.Int64
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil && writes.Add(1) <= 200 {
					if err := w.Set(ctx, "k", product{ID: "v"}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		for writes.Load() < 20 && ctx.Err() == nil && len(errs) == 0 {
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, r.Close())
		wg.Wait()
		cancel()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "round %d: a write waited for the closed cache", round)
		}
	}
	assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out the lease of a cache that closed")
}

// The registries and the marker keys are reserved: no value can be stored
// where they live, whatever the Cache's prefix (the registry's name does
// not begin with its own).
func TestCoherenceKeysAreReserved(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithPrefix(p))
	defer c.Close()
	bare := New[product](rdb, WithoutNearCache()) // no prefix: the registries of every prefix are keys it could name
	defer bare.Close()
	for _, k := range []string{coherence.RegistryKey(p), coherence.RegistryKey("{x}" + p), coherence.LegacyRegistryKey(p), coherence.MarkKeyPrefix(p) + "w:1"} {
		local := strings.TrimPrefix(k, p)
		cc := c
		if local == k {
			cc = bare
		}
		err := cc.Set(t.Context(), local, product{})
		assert.True(t, errors.Is(err, ErrReservedKey), "Set(%q): %v", local, err)
		_, err = cc.GetOrLoad(t.Context(), local, (&counter{}).load)
		assert.True(t, errors.Is(err, ErrReservedKey), "GetOrLoad(%q): %v", local, err)
	}
	// A name like a registry's that is not one is a key like any other.
	require.NoError(t, bare.Set(t.Context(), "{x}:stampede:near:"+p, product{}))
}

// On a Ring (no cluster bus) the marker is published on every shard: writes
// are acknowledged by another Ring's near cache, and read-after-write holds.
func TestRingWritesAreAcknowledged(t *testing.T) {
	t.Parallel()
	a := redistest.PrivateServer(t, "it runs a two-shard Ring")
	b := redistest.NewServer(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	wev, rev := &events{}, &events{}
	w := New[product](ring(), WithPrefix("ring:"), wev.option())
	defer w.Close()
	r := New[product](ring(), WithPrefix("ring:"), rev.option())
	defer r.Close()
	require.True(t, eventually(func() bool { return nearReady(w) && nearReady(r) }))
	src := &counter{}
	for i := range 40 {
		key := "k" + string(rune('a'+i%8)) // keys on both shards
		_, err := r.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
		want := product{ID: "v" + string(rune('a'+i))}
		require.NoError(t, w.Set(t.Context(), key, want))
		got, err := r.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
		require.Equal(t, want.ID, got.ID, "round %d: the other Ring's memory served the old value after Set returned", i)
	}
	assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out a running holder's lease: markers did not reach every shard")
	assert.Positive(t, rev.get(EventNearHit))
}

// A client that moves to another server (as a Sentinel failover moves it,
// closing its connections to the old master) while its tracking connection
// stays on the old one, which still answers: the lease renewal now runs on a server this process does not
// track, so memory stops being served (the old value stayed in it, since
// the new server's writes are reported to nobody here) and the tracking
// connection moves to the client's server.
func TestNearCacheFollowsItsClientToAnotherServer(t *testing.T) {
	t.Parallel()
	a := redistest.PrivateServer(t, "it moves a client between two servers")
	b := redistest.PrivateServer(t, "it moves a client between two servers")
	var target atomic.Value
	target.Store(a.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: "switched", Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, target.Load().(string))
	}})
	defer rdb.Close()
	ev := &events{}
	c := New[product](rdb, WithPrefix("sw:"), WithTTL(time.Hour), WithNearMaxAge(time.Hour), ev.option())
	defer c.Close()
	require.True(t, eventually(func() bool { return nearReady(c) }))
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "old"}))
	require.True(t, eventually(func() bool {
		v, err := c.Get(t.Context(), "k")
		return err == nil && v.ID == "old" && nearHas(c, "k")
	}), "the old value never reached memory")
	before := ev.get(EventNearHit)

	onB := New[product](redistest.Client(t, b.Addr), WithPrefix("sw:"), WithoutNearCache())
	defer onB.Close()
	require.NoError(t, onB.Set(t.Context(), "k", product{ID: "new"}))
	target.Store(b.Addr)
	// The client's connections to a end (go-redis's failover client closes
	// them on a switch); the tracking connection, a subscriber, stays.
	admA := redistest.Client(t, a.Addr)
	require.NoError(t, admA.ClientKillByFilter(t.Context(), "TYPE", "normal").Err())

	var got product
	require.True(t, eventually(func() bool {
		var err error
		got, err = c.Get(t.Context(), "k")
		return err == nil && got.ID == "new"
	}), "memory kept serving the old server's value: %+v", got)
	assert.Greater(t, ev.get(EventNearHit), before, "memory served before the switch")
	require.True(t, eventually(func() bool {
		return strings.Contains(redistest.Client(t, b.Addr).ClientList(t.Context()).Val(), "name=stampede-near")
	}), "the tracking connection did not move to the client's server")
	require.True(t, eventually(func() bool { return nearReady(c) }), "never sure again on the new server")
	for range 100 {
		v, err := c.Get(t.Context(), "k")
		require.NoError(t, err)
		require.Equal(t, "new", v.ID)
	}
}

// Every command the near cache needs (docs/GUARANTEES.md, Redis ACLs),
// refused one at a time: the near cache never serves, and says so once,
// naming the command or the script that ran it.
func TestNearCacheRefusedEachCommandItNeedsSaysSo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule  []string // "-cmd|sub" is Redis 7 only: a subcommand is denied by allowing the others
		named string
	}{
		{[]string{"-client", "+client|id", "+client|setname"}, "CLIENT"},
		{[]string{"-client", "+client|tracking", "+client|setname"}, "CLIENT"},
		{[]string{"-info"}, "INFO: NOPERM"},
		{[]string{"-time"}, "LEASE SCRIPT"},    // Redis names the script's line, not the command
		{[]string{"-hset"}, "LEASE SCRIPT"},    // Redis names the script's line, not the command
		{[]string{"-exists"}, "LEASE SCRIPT"},  // Redis names the script's line, not the command
		{[]string{"-pexpire"}, "LEASE SCRIPT"}, // Redis names the script's line, not the command
		{[]string{"-evalsha"}, "EVALSHA"},
	} {
		t.Run(strings.Join(tc.rule, " "), func(t *testing.T) {
			t.Parallel()
			rdb := limitedClient(t, tc.rule...)
			logs := &logCapture{}
			c := New[product](rdb, WithPrefix("nr:"), WithLogger(slog.New(logs)))
			defer c.Close()
			require.True(t, eventually(func() bool { return len(logs.lines(slog.LevelError)) > 0 }), "no report")
			time.Sleep(300 * time.Millisecond) // several more attempts
			lines := logs.lines(slog.LevelError)
			require.Len(t, lines, 1, "%q", lines)
			assert.Contains(t, lines[0], "near cache not serving")
			assert.Contains(t, strings.ToUpper(lines[0]), tc.named)
			assert.False(t, nearReady(c))
		})
	}
}
