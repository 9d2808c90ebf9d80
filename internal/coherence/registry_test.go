// This file tests where leases are registered: a name Redis does not
// report to the holders, the registry of earlier versions kept in step
// during a rolling upgrade, and the fallback when an ACL refuses the name.

package coherence

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The registry shares its slot and Ring shard (its hash tag's text) with
// the marker keys and the earlier versions' registry, does not begin with
// its prefix, and is told apart from value keys.
func TestRegistryKey(t *testing.T) {
	for _, p := range []string{"product:", "", "p{x}:", "a{b:"} {
		k := RegistryKey(p)
		assert.False(t, p != "" && strings.HasPrefix(k, p), "%q begins with its prefix %q", k, p)
		tag := func(s string) string { _, rest, _ := strings.Cut(s, "{"); t, _, _ := strings.Cut(rest, "}"); return t }
		for _, other := range []string{LegacyRegistryKey(p), MarkKeyPrefix(p) + "w:1"} {
			assert.Equal(t, slot.Of(other), slot.Of(k), "%q and %q in different slots", k, other)
			assert.Equal(t, tag(other), tag(k), "%q and %q on different Ring shards", k, other)
		}
		assert.True(t, IsRegistry(k), "IsRegistry(%q)", k)
	}
	for _, k := range []string{"product:k", "{x}:stampede:near:product:", "{", "{1}", LegacyRegistryKey("product:")} {
		assert.False(t, IsRegistry(k), "IsRegistry(%q)", k)
	}
}

// invalidations subscribes a connection of its own to the invalidations of
// every key under p (as a tracking connection of another process would)
// and counts those that arrive.
func invalidations(t *testing.T, addr, p string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, PoolSize: 1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			id, err := cn.ClientID(ctx).Result()
			if err != nil {
				return err
			}
			return cn.Process(ctx, redis.NewCmd(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", p)) // no Do on a Conn of go-redis 9.5
		}})
	sub := rdb.Subscribe(t.Context(), invalidateChannel)
	_, err := sub.Receive(t.Context())
	require.NoError(t, err)
	go func() {
		for m := range sub.Channel() {
			n.Add(int64(len(m.PayloadSlice) + len(m.Payload)))
		}
	}()
	t.Cleanup(func() { _ = sub.Close(); _ = rdb.Close() })
	return &n
}

// Lease renewals write no key under the prefix: with the registry under it,
// Redis reported every renewal of every process to every tracking
// connection of the prefix (N² messages a second). Unless the registry of
// earlier versions exists, which a holder then renews as they do.
func TestRenewalsAreNotReported(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	heard := invalidations(t, addr, p)
	lease := 200 * time.Millisecond // a renewal every 50 ms
	a := New(redistest.Client(t, addr), p, lease, Hooks{})
	defer a.Close()
	b := New(redistest.Client(t, addr), p, lease, Hooks{})
	defer b.Close()
	require.True(t, eventually(a.Serving) && eventually(b.Serving), "never serving")
	before := heard.Load()
	time.Sleep(4 * lease) // 16 renewals each
	assert.Zero(t, heard.Load()-before, "renewals reported under the prefix")
	assert.Zero(t, admin.Exists(t.Context(), LegacyRegistryKey(p)).Val(), "the registry of earlier versions made")

	// An older process's registry appears: both holders renew there too, as
	// the older processes do, and are heard again.
	require.NoError(t, admin.HSet(t.Context(), LegacyRegistryKey(p), "~since", 0).Err())
	require.NoError(t, admin.PExpire(t.Context(), LegacyRegistryKey(p), time.Minute).Err())
	for _, tr := range []*Tracker{a, b} {
		assert.True(t, eventually(func() bool { return admin.HExists(t.Context(), LegacyRegistryKey(p), tr.ID()).Val() }),
			"a holder not in the registry that writers of earlier versions read")
	}
	assert.Positive(t, admin.PTTL(t.Context(), LegacyRegistryKey(p)).Val(), "the older registry's expiry was lost")
}

// A holder of an earlier version, registered only where those versions
// register, is waited for by a writer of this one (here it never
// acknowledges, so its lease is waited out); and a holder listed in both
// registries counts once.
func TestWriterWaitsForHoldersOfEarlierVersions(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	wrdb := redistest.Client(t, addr)
	var lapsed atomic.Value
	w := NewWriter(wrdb, p, time.Second, Hooks{OnLapse: func(h string) { lapsed.Store(h) }})
	defer w.Close()
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err()) // no grace for a new registry
	now := time.Now()
	srv, err := admin.Time(t.Context()).Result()
	require.NoError(t, err)
	end := srv.Add(300 * time.Millisecond).UnixMilli()
	require.NoError(t, admin.HSet(t.Context(), LegacyRegistryKey(p), "~since", 0, "old", end).Err())
	write(t, w, wrdb, p+"k", 1)
	assert.Equal(t, "old", lapsed.Load(), "the older holder was not waited for")
	assert.GreaterOrEqual(t, time.Since(now), 200*time.Millisecond, "returned long before the older holder's lease ended")

	reply, err := confirmScript.Run(t.Context(), wrdb, w.registries(), "", "x:1").Slice()
	require.NoError(t, err)
	_, _, leases, err := parseLeases(append(reply, "old", end+5))
	require.NoError(t, err)
	assert.Equal(t, end+5, leases["old"], "a holder listed twice: not the later lease end")
}

// A writer forgets the holders gone a minute (they died without Close), as
// it reads the registry, and keeps the others.
func TestWriterForgetsHoldersLongGone(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	wrdb := redistest.Client(t, addr)
	w := NewWriter(wrdb, p, time.Second, Hooks{})
	defer w.Close()
	srv, err := admin.Time(t.Context()).Result()
	require.NoError(t, err)
	now := srv.UnixMilli()
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0, "gone", now-61_000, "recent", now-1_000).Err())
	write(t, w, wrdb, p+"k", 1)
	fields, err := admin.HKeys(t.Context(), RegistryKey(p)).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"~since", "recent"}, fields)
}

// A renewal whose PING could not be sent (its connection closed under it,
// still counted as subscribed) proves nothing and must not extend the lease.
func TestRenewalFailsOnAPingNotSent(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	tr := New(redistest.Client(t, addr), p, 40*time.Second, Hooks{})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	conns := tr.hub.conns()
	require.Len(t, conns, 1)
	dead := redis.NewClient(&redis.Options{Addr: addr})
	ps := dead.Subscribe(t.Context(), "x")
	_ = ps.Close()
	_ = dead.Close()
	require.True(t, conns[0].n.subbed.Load())
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	assert.False(t, tr.hub.pingAll(ctx, []trackedConn{{n: conns[0].n, sub: ps}}), "a renewal counted a PING it never sent")
}

// The registry of earlier versions lost (evicted) while their leases may
// run: a writer that had seen it waits as for a new registry, once.
func TestLostRegistryOfEarlierVersionsIsWaitedOut(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	wrdb := redistest.Client(t, addr)
	const lease = 600 * time.Millisecond
	w := NewWriter(wrdb, p, lease, Hooks{})
	defer w.Close()
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err())
	require.NoError(t, admin.HSet(t.Context(), LegacyRegistryKey(p), "~since", 0).Err())
	timed := func() time.Duration {
		began := time.Now()
		write(t, w, wrdb, p+"k", 1)
		return time.Since(began)
	}
	assert.Less(t, timed(), lease/2, "waited with both registries there")
	require.NoError(t, admin.Del(t.Context(), LegacyRegistryKey(p)).Err())
	assert.GreaterOrEqual(t, timed(), lease/2, "did not wait for the leases the lost registry held")
	time.Sleep(lease)
	assert.Less(t, timed(), lease/2, "waited again for a loss already waited out")
}

// Writes at once under the rule of earlier versions on a client whose
// confirmations are not pipelined with the write (a Ring): each one whose
// script was refused before another switched to the old registry runs
// again, and none fails.
func TestConcurrentWritesSwitchToTheOldRegistry(t *testing.T) {
	srv := redistest.PrivateServer(t, "it creates an ACL user")
	admin := redistest.Client(t, srv.Addr)
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "u", "on", ">s", "resetkeys", "resetchannels",
		"~product:*", "&product:*", "&__redis__:invalidate", "+@all").Err())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}, Username: "u", Password: "s"})
	t.Cleanup(func() { _ = ring.Close() })
	var narrowed atomic.Int64
	w := NewWriter(ring, "product:", time.Second, Hooks{OnNarrow: func(error) { narrowed.Add(1) }})
	defer w.Close()
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			ctx := t.Context()
			wait, err := w.Write(ctx, []string{"product:k"}, nil, func() error { return ring.Set(ctx, "product:k", i, 0).Err() })
			if err == nil {
				err = wait()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.EqualValues(t, 1, narrowed.Load(), "the switch reported once")
}

// A tracker narrowed by the rule of earlier versions asks for the registry
// again every RegistryRetry: refused, it says nothing more and keeps
// serving; once the rule grants the registry, it renews there, says so
// once, and stays in the old registry too while a holder still narrowed
// (another user's, whose rule was not fixed) keeps that alive; writes are
// acknowledged by both, none waited out.
func TestNarrowedTrackerTakesUpAFixedRule(t *testing.T) {
	retry := RegistryRetry
	RegistryRetry = 100 * time.Millisecond
	t.Cleanup(func() { RegistryRetry = retry })
	srv := redistest.PrivateServer(t, "it creates an ACL user")
	admin := redistest.Client(t, srv.Addr)
	for _, u := range []string{"fixed", "old"} {
		require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", u, "on", ">s", "resetkeys", "resetchannels",
			"~product:*", "&product:*", "&__redis__:invalidate", "+@all").Err())
	}
	user := func(name string) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: name, Password: "s"})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	var narrowed, widened, lapsed atomic.Int64
	hooks := Hooks{OnNarrow: func(error) { narrowed.Add(1) }, OnWiden: func() { widened.Add(1) }, OnLapse: func(string) { lapsed.Add(1) }}
	lease := 400 * time.Millisecond // a renewal every 100 ms
	h := New(user("fixed"), "product:", lease, hooks)
	defer h.Close()
	old := New(user("old"), "product:", lease, hooks)
	defer old.Close()
	w := NewWriter(user("fixed"), "product:", lease, hooks)
	defer w.Close()
	require.True(t, eventually(h.Serving) && eventually(old.Serving), "never serving under the old rule")
	write := func() {
		t.Helper()
		ctx := t.Context()
		wait, err := w.Write(ctx, []string{"product:k"}, func(p redis.Pipeliner) { p.Set(ctx, "product:k", "v", 0) }, nil)
		require.NoError(t, err)
		require.NoError(t, wait())
	}
	write()
	time.Sleep(5 * RegistryRetry) // probes, refused
	assert.True(t, h.Serving(), "a refused probe stopped the renewals")
	write()
	assert.EqualValues(t, 3, narrowed.Load(), "one warning per tracker, whatever the probes")
	assert.Zero(t, widened.Load())
	assert.Zero(t, admin.Exists(t.Context(), RegistryKey("product:")).Val())

	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "fixed", "~{*}:stampede:near:product:").Err())
	assert.True(t, eventually(func() bool { return admin.HExists(t.Context(), RegistryKey("product:"), h.ID()).Val() }),
		"the holder never took up the registry the rule grants now")
	time.Sleep(lease) // past the new registry's grace
	write()
	assert.EqualValues(t, 2, widened.Load(), "widened %d times; want once per tracker whose rule was fixed", widened.Load())
	time.Sleep(lease)
	assert.True(t, h.Serving() && old.Serving())
	assert.True(t, admin.HExists(t.Context(), LegacyRegistryKey("product:"), h.ID()).Val(),
		"the holder left the old registry while a narrowed holder keeps it")
	assert.False(t, admin.HExists(t.Context(), RegistryKey("product:"), old.ID()).Val(), "the old rule's holder wrote the registry it may not")
	lapsed.Store(0)
	for range 5 {
		write()
	}
	assert.Zero(t, lapsed.Load(), "writes waited out a lease with every holder alive")
	assert.EqualValues(t, 3, narrowed.Load())
}

// A narrowed holder's Close does not spend the try of the registry: refused,
// it would skip the PINGs that let writes in flight be acknowledged, so
// that each waited out the closing holder's lease.
func TestNarrowedHolderResignsWithPings(t *testing.T) {
	retry := RegistryRetry
	t.Cleanup(func() { RegistryRetry = retry })
	srv := redistest.PrivateServer(t, "it creates an ACL user and counts PINGs")
	admin := redistest.Client(t, srv.Addr)
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "u", "on", ">s", "resetkeys", "resetchannels",
		"~product:*", "&product:*", "&__redis__:invalidate", "+@all").Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "u", Password: "s"})
	t.Cleanup(func() { _ = rdb.Close() })
	h := New(rdb, "product:", 400*time.Millisecond, Hooks{})
	require.True(t, eventually(h.Serving), "never serving under the old rule")
	require.True(t, h.narrow.Load())
	pings := func() int64 {
		info := admin.Info(t.Context(), "commandstats").Val()
		_, rest, _ := strings.Cut(info, "cmdstat_ping:calls=")
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		require.NoError(t, err, "%q", info)
		return v
	}
	RegistryRetry = time.Nanosecond // the minute has just passed
	before := pings()
	h.Close()
	assert.Positive(t, pings()-before, "Close sent no PING: writes in flight wait out its lease")
	assert.False(t, admin.HExists(t.Context(), LegacyRegistryKey("product:"), h.ID()).Val(), "still in the registry")
}
