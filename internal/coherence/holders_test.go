package coherence

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holderTracker starts a strict per-key tracker of prefix p on a client of
// its own, whose globals are the tag versions' (holderGlobals), with a
// lease of lease, and waits until it serves. onDrop (nil: none) is its
// OnDrop.
func holderTracker(t *testing.T, addr, p string, lease time.Duration, onDrop func(key string, all bool)) (*Tracker, *redis.Client) {
	t.Helper()
	rdb := redistest.Client(t, addr)
	hub := NewHub(rdb)
	t.Cleanup(hub.Close)
	if onDrop == nil {
		onDrop = func(string, bool) {}
	}
	tr := hub.NewHolder(p, holderGlobals(p), lease, Hooks{
		OnDrop: onDrop,
		Global: func(key string) bool { return strings.HasPrefix(key, holderGlobals(p)) },
	})
	t.Cleanup(tr.Close)
	require.True(t, eventually(tr.Serving), "the holder never served")
	return tr, rdb
}

// slowDrops is an OnDrop that takes slow for each drop of a key (not of
// everything) for which counts says so, then counts it in n.
func slowDrops(slow time.Duration, n *atomic.Int64, counts func(key string, all bool) bool) func(string, bool) {
	return func(key string, all bool) {
		if counts(key, all) {
			time.Sleep(slow)
			n.Add(1)
		}
	}
}

// only counts the drops of key alone.
func only(key string) func(string, bool) bool {
	return func(k string, all bool) bool { return !all && k == key }
}

// holderGlobals are the globals of prefix p as the cache has them (the tag
// versions, internal/tags): they sort after p's marker keys, which is what
// makes a marker tracked under a prefix of its own overtake them.
func holderGlobals(p string) string { return slot.Under(p, ":stampede:tag") }

// publishes returns how many PUBLISH commands Redis ran since the last
// CONFIG RESETSTAT, scripts' included.
func publishes(t *testing.T, admin *redis.Client) int64 {
	t.Helper()
	info := admin.Info(t.Context(), "commandstats").Val()
	_, rest, ok := strings.Cut(info, "cmdstat_publish:calls=")
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(rest[:strings.IndexAny(rest, ",\r\n")], 10, 64)
	require.NoError(t, err)
	return n
}

// A read through a holder's reader registers it as a holder of the key,
// and a write of that key waits for its acknowledgement, which comes after
// the holder dropped the key: never a lease waited out. A write of a key
// it does not hold announces nothing to it and waits for nobody.
func TestHolderIsWaitedForOnlyForTheKeysItHolds(t *testing.T) {
	srv := redistest.PrivateServer(t, "it counts PUBLISH calls")
	admin := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	const slow = 200 * time.Millisecond
	var dropped atomic.Int64
	const lease = 8 * time.Second
	held, other := p+"held", p+"other"
	tr, rdb := holderTracker(t, srv.Addr, p, lease, slowDrops(slow, &dropped, func(k string, all bool) bool { return !all && (k == held || k == other) }))
	for _, k := range []string{held, other} {
		require.NoError(t, admin.Set(t.Context(), k, "v0", 0).Err())
	}
	reader := tr.ReadVia(rdb)
	require.NotNil(t, reader, "no reader for the server")
	require.NoError(t, reader.Get(t.Context(), held).Err())
	assert.Equal(t, []string{tr.ID()}, admin.HKeys(t.Context(), HoldersKey(held)).Val(), "the read did not register its holder")
	assert.Zero(t, admin.Exists(t.Context(), HoldersKey(other)).Val())
	assert.InDelta(t, HoldTTL.Milliseconds(), admin.PTTL(t.Context(), HoldersKey(held)).Val().Milliseconds(), 5000)

	wrdb := redistest.Client(t, srv.Addr)
	var lapses atomic.Int64
	w := NewWriter(wrdb, p, lease, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer w.Close()
	require.NoError(t, admin.HSet(t.Context(), HoldRegistryKey(p), "~since", 0).Err()) // no grace for a new registry
	require.NoError(t, admin.ConfigResetStat(t.Context()).Err())
	for i := range 3 {
		began := time.Now()
		write(t, w, wrdb, other, i)
		assert.Less(t, time.Since(began), slow, "a write of a key nobody holds waited")
	}
	assert.Zero(t, publishes(t, admin), "a write of a key nobody holds announced itself")
	assert.Zero(t, dropped.Load(), "the holder heard writes of a key it never read")

	write(t, w, wrdb, held, 1) // (the first wait opens the writer's subscription, then asks again)
	assert.EqualValues(t, 1, dropped.Load(), "the write returned before its key's holder dropped it")
	require.NoError(t, reader.Get(t.Context(), held).Err())
	began := time.Now()
	write(t, w, wrdb, held, 2)
	assert.EqualValues(t, 2, dropped.Load(), "the write returned before its key's holder dropped it")
	assert.Less(t, time.Since(began), lease/4, "the holder was not told at once: the write waited to ask again")
	assert.Zero(t, lapses.Load(), "the writer waited out a running lease")
}

// A holder that no longer acknowledges (its connections cut off here, as a
// frozen or partitioned process) is waited for at most until its lease
// ends; and it stops serving before that.
func TestSilentHolderIsWaitedOutByItsLease(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	proxy := redistest.NewProxy(t, addr)
	const lease = 800 * time.Millisecond
	tr, rdb := holderTracker(t, proxy.Addr, p, lease, nil)
	key := p + "k"
	require.NoError(t, admin.Set(t.Context(), key, "v0", 0).Err())
	require.NoError(t, tr.ReadVia(rdb).Get(t.Context(), key).Err())
	require.NoError(t, admin.HSet(t.Context(), HoldRegistryKey(p), "~since", 0).Err())
	release := proxy.Hold(t, admin, tr.ConnIDs()[0]) // no marker, no PONG reaches it from here on
	defer release()

	wrdb := redistest.Client(t, addr)
	var lapses atomic.Int64
	w := NewWriter(wrdb, p, lease, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer w.Close()
	began := time.Now()
	write(t, w, wrdb, key, 1)
	assert.EqualValues(t, 1, lapses.Load(), "the writer did not wait out the silent holder")
	assert.Less(t, time.Since(began), 2*lease)
	assert.False(t, tr.Serving(), "the silent holder still serves after the writer gave up on it")
}

// A write of a key every holder tracks (a tag or Clear version, under the
// globals) waits for every holder, whatever they read: each has dropped
// what depends on the key before the write returns.
func TestWriteOfAGlobalKeyWaitsForEveryHolder(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	version := holderGlobals(p) + "#all"
	var dropped atomic.Int64
	isVersion := func(key string, all bool) bool { return all && key == version }
	for range 2 {
		holderTracker(t, addr, p, 3*time.Second, slowDrops(200*time.Millisecond, &dropped, isVersion))
	}
	require.NoError(t, admin.HSet(t.Context(), HoldRegistryKey(p), "~since", 0).Err())
	wrdb := redistest.Client(t, addr)
	var lapses atomic.Int64
	w := NewWriter(wrdb, p, 3*time.Second, Hooks{
		OnLapse: func(string) { lapses.Add(1) },
		Global:  func(k string) bool { return strings.HasPrefix(k, holderGlobals(p)) },
	})
	defer w.Close()
	write(t, w, wrdb, version, 1)
	assert.EqualValues(t, 2, dropped.Load(), "the write of a global key returned before every holder dropped what depends on it")
	assert.Zero(t, lapses.Load())
}

// Writers of earlier versions (which know only the prefix's registry, or,
// before 0.4, only the one under the prefix, and confirm with confirm.lua;
// here writers whose per-key confirmation is off, the second narrowed to
// the older registry as an ACL of that time made them) wait for a per-key
// holder: it leases in both registries while they exist, and hears their
// marker key at once.
func TestWriterOfEarlierVersionsWaitsForPerKeyHolders(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(map[bool]string{false: "0.4", true: "before-0.4"}[older], func(t *testing.T) {
			addr := redistest.Addr(t)
			admin := redistest.Client(t, addr)
			p := redistest.Prefix(t, admin)
			const slow = 200 * time.Millisecond
			var dropped atomic.Int64
			key := p + "k"
			tr, rdb := holderTracker(t, addr, p, 3*time.Second, slowDrops(slow, &dropped, only(key)))
			require.NoError(t, admin.Set(t.Context(), key, "v0", 0).Err())
			wrdb := redistest.Client(t, addr)
			var lapses atomic.Int64
			w := NewWriter(wrdb, p, 3*time.Second, Hooks{OnLapse: func(string) { lapses.Add(1) }})
			defer w.Close()
			w.holdRefusedAt.Store(nanotime()) // confirms as earlier versions do
			registry := RegistryKey(p)
			if older {
				registry = LegacyRegistryKey(p)
				w.narrow.Store(true)
				w.narrowAt.Store(nanotime())
			}
			require.NoError(t, admin.HSet(t.Context(), registry, "~since", 0).Err()) // an earlier writer's registry, older than a lease
			require.True(t, eventually(func() bool { return admin.HExists(t.Context(), registry, tr.ID()).Val() }), "the per-key holder never leased in the earlier versions' registry")
			for i := range 2 { // the second with the writer's subscription open: no asking again at once
				require.NoError(t, tr.ReadVia(rdb).Get(t.Context(), key).Err())
				dropped.Store(0)
				began := time.Now()
				write(t, w, wrdb, key, i)
				assert.EqualValues(t, 1, dropped.Load(), "the earlier version's write returned before the per-key holder dropped the key")
				if i == 1 {
					assert.Less(t, time.Since(began), 3*time.Second/4, "the holder did not hear the marker key: the write waited to ask again")
				}
			}
			assert.Zero(t, lapses.Load(), "the writer waited out the per-key holder's lease")
			tr.Close()
			assert.False(t, admin.HExists(t.Context(), registry, tr.ID()).Val(), "the closed holder still leases in the earlier versions' registry")
		})
	}
}

// A holder whose lease ended over a minute ago is removed from the holders
// of the keys a write finds it in (a process restarted leaves its id
// behind); one whose lease ended less long ago, or runs, stays.
func TestWritesForgetHoldersLongGone(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	key := p + "k"
	now := time.Now().UnixMilli() // (this host's clock is the server's)
	require.NoError(t, admin.HSet(t.Context(), HoldRegistryKey(p), "~since", 0, "gone", now-120_000, "recent", now-1_000).Err())
	require.NoError(t, admin.HSet(t.Context(), HoldersKey(key), "gone", "1", "recent", "1").Err())
	wrdb := redistest.Client(t, addr)
	w := NewWriter(wrdb, p, time.Second, Hooks{})
	defer w.Close()
	write(t, w, wrdb, key, 1)
	assert.ElementsMatch(t, []string{"recent"}, admin.HKeys(t.Context(), HoldersKey(key)).Val())
}
