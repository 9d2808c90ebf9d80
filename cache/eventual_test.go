// This file tests WithEventualNearCache: nobody waits for such a
// process, frozen or not, whatever mode the writer has; invalidations still
// drop its memory; the max age bounds how old a value it serves can be when
// they do not come; its own writes still wait for the strict near caches
// of the prefix, whose promise therefore holds; and its per-key tracking
// keeps only what its readers read, through servers that close idle
// connections, callers' deadlines and readers left open.

package cache

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freezableTracking is a dialer whose tracking connections read nothing
// while frozen is set: the process hears neither invalidations, markers nor
// PONGs, as a frozen or cut-off process, while its other connections work.
func freezableTracking(frozen *atomic.Bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	// Reads are held back after they return: the receiving goroutine may
	// already be blocked in one when the freeze begins.
	return trackingDialer(nil, func() {
		for frozen.Load() {
			time.Sleep(time.Millisecond)
		}
	})
}

// freezableNearCache is a near-cached Cache, ready, whose tracking
// connections stop reading while frozen is set; cmds counts its client's
// commands.
func freezableNearCache(t *testing.T, p string, frozen *atomic.Bool, opts ...Option) (*Cache[product], *events, *redistest.Commands) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: freezableTracking(frozen)})
	t.Cleanup(func() { _ = rdb.Close() })
	cmds := redistest.CountCommands(rdb)
	c, ev := newNearCacheOn(t, rdb, p, opts...)
	t.Cleanup(func() { frozen.Store(false) }) // before Close, which waits for the reading goroutines
	return c, ev, cmds
}

// agedRegistry makes p's registry older than a lease, so that no write
// waits out the grace of a new one.
func agedRegistry(t *testing.T, admin *redis.Client, p string) {
	t.Helper()
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Minute.Milliseconds()).Err())
}

// warmNear reads key through c until c serves want from memory.
func warmNear(t *testing.T, c *Cache[product], key, want string) {
	t.Helper()
	require.True(t, eventually(func() bool {
		v, err := c.Get(t.Context(), key)
		return err == nil && v.ID == want && nearHas(c, key)
	}), "%q never reached memory", want)
}

// TestNothingWaitsForAnEventualNearCache: a process with an eventual near
// cache, its tracking connections frozen, holds no lease and acknowledges
// nothing, and no Set, Delete or Expire waits for it, whether the writer's
// near cache is strict, eventual or off. (A strict reader frozen the same
// way costs the writer a lease wait: TestEventualWriterWaitsForStrictReaders.)
func TestNothingWaitsForAnEventualNearCache(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"strict writer", WithNearCache(1 << 20)},
		{"eventual writer", WithEventualNearCache(time.Minute)},
		{"writer without near cache", WithoutNearCache()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin, p := setup(t)
			agedRegistry(t, admin, p)
			var frozen atomic.Bool
			r, _, rcmds := freezableNearCache(t, p, &frozen, WithEventualNearCache(time.Minute))
			wev := &events{}
			w := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithStale(time.Minute), tc.opt, wev.option())
			defer w.Close()
			if w.near != nil {
				require.True(t, eventually(func() bool { return nearReady(w) }))
			}
			require.NoError(t, w.Set(t.Context(), "k", product{ID: "old"}))
			warmNear(t, r, "k", "old")
			time.Sleep(300 * time.Millisecond) // past a renewal, had it one
			assert.False(t, admin.HExists(t.Context(), coherence.RegistryKey(p), r.near.track.ID()).Val(), "the eventual process holds a lease")

			frozen.Store(true)
			for i := range 5 {
				require.NoError(t, w.Set(t.Context(), "k", product{ID: strconv.Itoa(i)}))
				require.NoError(t, w.Expire(t.Context(), "k"))
				require.NoError(t, w.Delete(t.Context(), "k"))
			}
			assert.Zero(t, wev.get(EventNearLeaseWait), "writes waited out the frozen eventual process")
			assert.Zero(t, rcmds.Count("publish"), "the eventual process acknowledged writes")
		})
	}
}

// TestEventualWriterWaitsForStrictReaders: strict readers whose
// invalidations come 20ms late never get the old value after an eventual
// writer's Set or Delete returned (it waits for their acknowledgements, as
// every writer does), and a frozen strict reader is waited out, which is
// what keeps their promise.
func TestEventualWriterWaitsForStrictReaders(t *testing.T) {
	admin, p := setup(t)
	agedRegistry(t, admin, p)
	readers := []*Cache[product]{mixedReader(t, p), mixedReader(t, p)}
	w, wev := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(time.Minute))
	stale := 0
	for i := range 20 {
		old, next := "v"+strconv.Itoa(i), "v"+strconv.Itoa(i+1)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: old}))
		for _, r := range readers {
			warmNear(t, r, "k", old)
		}
		if i%4 == 3 {
			require.NoError(t, w.Delete(t.Context(), "k"))
		} else {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: next}))
		}
		for _, r := range readers {
			if v, err := r.Get(t.Context(), "k"); err == nil && v.ID == old {
				stale++
			}
		}
	}
	assert.Zero(t, stale, "strict reads that began after the eventual writer's write returned got the old value")
	assert.Zero(t, wev.get(EventNearLeaseWait), "the eventual writer waited out a strict reader: acknowledgements did not reach it")

	var frozen atomic.Bool
	s, _, _ := freezableNearCache(t, p, &frozen)
	require.NoError(t, w.Set(t.Context(), "f", product{ID: "old"}))
	warmNear(t, s, "f", "old")
	frozen.Store(true)
	require.NoError(t, w.Set(t.Context(), "f", product{ID: "new"}))
	assert.Equal(t, int64(1), wev.get(EventNearLeaseWait), "the eventual writer did not wait for the frozen strict reader")
	frozen.Store(false)
	v, err := s.Get(t.Context(), "f")
	require.NoError(t, err)
	assert.Equal(t, "new", v.ID, "the strict reader served the old value after the write returned")
}

// TestEventualNearCacheDropsInvalidatedValues: with a max age far longer
// than the test, another process's writes still reach the eventual process
// within moments: invalidations drop its memory, and it serves from memory
// again afterwards.
func TestEventualNearCacheDropsInvalidatedValues(t *testing.T) {
	admin, p := setup(t)
	agedRegistry(t, admin, p)
	r, rev := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(time.Hour))
	w, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(time.Hour))
	const rounds = 10
	for i := range rounds {
		old, next := "v"+strconv.Itoa(i), "v"+strconv.Itoa(i+1)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: old}))
		warmNear(t, r, "k", old)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: next}))
		warmNear(t, r, "k", next) // within eventually's 5s, an hour before the max age
		hits := rev.get(EventNearHit)
		_, err := r.Get(t.Context(), "k")
		require.NoError(t, err)
		assert.Greater(t, rev.get(EventNearHit), hits, "round %d: not served from memory", i)
	}
	assert.True(t, eventually(func() bool { return rev.get(EventNearInvalidation) >= int64(rounds) }), "memory was not dropped by invalidations")
}

// TestEventualNearCacheMaxAgeBoundsStaleness: its invalidations held back
// (its tracking connection frozen), an eventual process serves the value a
// write replaced, but none of its reads that begins more than the max age
// after the write returned gets it.
func TestEventualNearCacheMaxAgeBoundsStaleness(t *testing.T) {
	admin, p := setup(t)
	agedRegistry(t, admin, p)
	const maxAge = 300 * time.Millisecond
	var frozen atomic.Bool
	r, _, _ := freezableNearCache(t, p, &frozen, WithEventualNearCache(maxAge))
	w, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(maxAge))
	// r has not read k: tracked per key, it is told of no write before it
	// does, so no late invalidation can drop "old" from memory below.
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "old"}))
	warmNear(t, r, "k", "old")
	frozen.Store(true)
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "new"}))
	done := time.Now()
	var oldReads int
	var lastOld time.Duration
	for time.Since(done) < 10*maxAge {
		began := time.Since(done)
		v, err := r.Get(t.Context(), "k")
		require.NoError(t, err)
		if v.ID == "new" {
			break
		}
		oldReads, lastOld = oldReads+1, began
		time.Sleep(time.Millisecond)
	}
	require.Positive(t, oldReads, "no old read: the invalidation was not held back, the test proves nothing")
	assert.Less(t, lastOld, maxAge, "an old value served after the max age")
	v, err := r.Get(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "new", v.ID, "still old %v after the write", 10*maxAge)
}

func TestWithEventualNearCacheOptions(t *testing.T) {
	assert.PanicsWithError(t, "cache: WithEventualNearCache(0s): maxAge must be positive", func() {
		newConfig([]Option{WithEventualNearCache(0)})
	})
	c := newConfig([]Option{WithoutNearCache(), WithEventualNearCache(time.Second)})
	assert.True(t, c.near.enabled() && c.near.eventual, "the option turns the near cache on")
	assert.Equal(t, time.Second, c.near.maxAge)
	c = newConfig(nil)
	assert.False(t, c.near.eventual, "strict is the default")
}

// TestPerKeyNearCacheServesTheNextWriteAfterItsOwnLoad: an eventual near
// cache is told only of writes of keys it read through its tracked reader.
// The process that loaded and wrote a value keeps nothing (its own write
// voided the read, tracked even as a miss) and serves another process's
// next write at once; what it then reads through its reader it keeps.
func TestPerKeyNearCacheServesTheNextWriteAfterItsOwnLoad(t *testing.T) {
	admin, p := setup(t)
	agedRegistry(t, admin, p)
	r, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(time.Hour))
	w := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache())
	t.Cleanup(func() { w.Close() })
	require.True(t, r.near.perKey, "an eventual near cache on a single server tracks per key")
	v, err := r.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: "loaded"}, nil })
	require.NoError(t, err)
	require.Equal(t, "loaded", v.ID)
	assert.False(t, nearHas(r, "k"), "a value the process loaded was kept, though Redis tracks no read of it")
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "written"}))
	v, err = r.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: "reloaded"}, nil })
	require.NoError(t, err)
	assert.Equal(t, "written", v.ID, "the loading process served its own value after another's write")
	warmNear(t, r, "k", "written") // read through the reader: kept
}

// TestPerKeyNearCacheRefusesRepliesItsReaderDidNotRead: a reply read where
// Redis does not report the key's writes to this process (the user's
// client, when the reader failed on the wire) is never kept, however valid
// its ticket: nothing would drop it before the max age.
func TestPerKeyNearCacheRefusesRepliesItsReaderDidNotRead(t *testing.T) {
	admin, p := setup(t)
	agedRegistry(t, admin, p)
	r, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(time.Hour))
	data, err := r.cfg.codec.Marshal(product{ID: "v"})
	require.NoError(t, err)
	reply := func(tracked bool) *result[product] {
		return &result[product]{data: data, freshness: record.Freshness{Expiry: time.Now().Add(time.Minute)}, tracked: tracked}
	}
	r.near.keep(r, p+"k", r.nearTicket(p+"k"), reply(false))
	assert.False(t, nearHas(r, "k"), "a reply the reader did not read was kept")
	r.near.keep(r, p+"k", r.nearTicket(p+"k"), reply(true))
	assert.True(t, nearHas(r, "k"), "a reply the reader read was not kept")
}

// TestPerKeyNearCacheWithAFullTrackingTable: Redis remembers the keys each
// client read in a table of at most tracking-table-max-keys keys; past it,
// it forgets keys and sends their invalidations, as if they were written.
// A per-key near cache then drops them, so a process that holds more keys
// than the table serves fewer from memory, never an old value: with a max
// age of an hour, every write still reaches its memory at once.
func TestPerKeyNearCacheWithAFullTrackingTable(t *testing.T) {
	srv := redistest.PrivateServer(t, "TestPerKeyNearCacheWithAFullTrackingTable sets the server's tracking-table-max-keys")
	admin := redistest.Client(t, srv.Addr)
	require.NoError(t, admin.ConfigSet(t.Context(), "tracking-table-max-keys", "10").Err())
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p)
	r, ev := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, WithEventualNearCache(time.Hour))
	w := New[product](redistest.Client(t, srv.Addr), WithPrefix(p), WithoutNearCache())
	t.Cleanup(func() { w.Close() })
	const keys = 40 // four times the table
	for round := range 3 {
		want := "v" + strconv.Itoa(round)
		for i := range keys {
			require.NoError(t, w.Set(t.Context(), "k"+strconv.Itoa(i), product{ID: want}))
		}
		for i := range keys { // each key read and kept: the table overflows
			require.True(t, eventually(func() bool {
				v, err := r.Get(t.Context(), "k"+strconv.Itoa(i))
				return err == nil && v.ID == want
			}), "round %d: key %d old after its write", round, i)
		}
	}
	info, err := admin.Info(t.Context(), "stats").Result()
	require.NoError(t, err)
	_, rest, ok := strings.Cut(info, "tracking_total_keys:")
	require.True(t, ok, "INFO stats has no tracking_total_keys")
	tracked, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	require.NoError(t, err)
	assert.LessOrEqual(t, tracked, 10, "the table was not full: the test proves nothing")
	assert.Positive(t, ev.get(EventNearInvalidation), "no invalidation dropped anything from memory")
	t.Logf("near hits %d, invalidations %d of %d keys kept per round", ev.get(EventNearHit), ev.get(EventNearInvalidation), keys)
}

// readerConnCount counts the per-key readers' connections on the server.
func readerConnCount(t *testing.T, admin *redis.Client) int {
	t.Helper()
	list, err := admin.ClientList(t.Context()).Result()
	require.NoError(t, err)
	return strings.Count(list, " name="+coherence.ReaderName+" ")
}

// TestPerKeyNearCacheAfterTheServerClosesAnIdleReader: Redis closes idle
// normal clients after `timeout` seconds (managed services set it; a
// subscribed connection is exempt, a reader's connection is not). What the
// killed connection read is no longer tracked and nobody is told; the
// process notices only when it next reads through that connection, which a
// process serving its hot keys from memory never does. So a write of a kept
// key is never heard: memory serves the old value for the whole max age.
// Broadcast tracking (the eventual mode before the change) has no such
// hole: its only tracking connection is the exempt subscriber, pinged every
// second.
func TestPerKeyNearCacheAfterTheServerClosesAnIdleReader(t *testing.T) {
	srv := redistest.PrivateServer(t, "it sets the server's idle timeout", "--timeout", "1")
	admin := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p)
	r, _ := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, WithEventualNearCache(time.Hour))
	require.True(t, r.near.perKey)
	w := New[product](redistest.Client(t, srv.Addr), WithPrefix(p), WithoutNearCache())
	t.Cleanup(func() { w.Close() })

	require.NoError(t, w.Set(t.Context(), "k", product{ID: "old"}))
	warmNear(t, r, "k", "old")
	require.Positive(t, readerConnCount(t, admin), "no reader connection")
	// Idle past the server's timeout: a reader connection that sat idle is
	// closed (the hub's own check, which uses one every second, may keep
	// that one alive; either way the write below must be heard).
	time.Sleep(2500 * time.Millisecond)
	require.True(t, eventually(r.near.track.Serving), "the tracker never served again")

	require.NoError(t, w.Set(t.Context(), "k", product{ID: "new"}))
	ok := eventually(func() bool {
		v, err := r.Get(t.Context(), "k")
		return err == nil && v.ID == "new"
	})
	assert.True(t, ok, "memory served the old value 5s after its write (max age 1h): the invalidation was lost with the killed reader connection")
}

// TestPerKeyNearCacheSurvivesACallerDeadline: cache.New asks for
// ContextTimeoutEnabled, which the reader copies, so a caller whose ctx
// deadline ends while its read is on a reader connection makes go-redis
// close that connection (a timeout is a bad connection), and every close of
// a reader connection drops the memory of every per-key cache on the
// client. One impatient caller of any key empties everyone's near cache;
// under a latency spike, every one does. (Before the change that read went
// through the user's client: the closed connection cost nothing else.)
func TestPerKeyNearCacheSurvivesACallerDeadline(t *testing.T) {
	srv := redistest.PrivateServer(t, "it pauses the server")
	admin := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p)
	r, ev := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, WithEventualNearCache(time.Hour))
	require.True(t, r.near.perKey)
	require.NoError(t, admin.Set(t.Context(), p+"other", "x", 0).Err()) // (not a record: the read's outcome does not matter)
	w := New[product](redistest.Client(t, srv.Addr), WithPrefix(p), WithoutNearCache())
	t.Cleanup(func() { w.Close() })
	require.NoError(t, w.Set(t.Context(), "hot", product{ID: "v"}))
	warmNear(t, r, "hot", "v")
	drops := ev.get(EventNearDrop)

	// Control: the same pause, a caller who waits it out: memory stays.
	require.NoError(t, admin.Do(t.Context(), "client", "pause", 300, "all").Err())
	_, _ = r.Get(t.Context(), "cold")
	require.True(t, nearHas(r, "hot"), "a pause alone dropped memory: the test proves nothing")

	require.NoError(t, admin.Do(t.Context(), "client", "pause", 500, "all").Err())
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := r.Get(ctx, "cold") // not in memory: read through the reader, which the server holds
	cancel()
	require.Error(t, err)
	time.Sleep(600 * time.Millisecond) // the pause ends

	assert.True(t, nearHas(r, "hot"), "one caller's deadline on another key dropped the whole near cache (near drops %d -> %d)", drops, ev.get(EventNearDrop))
}

// TestClosingAPerKeyCacheClosesItsReaders: the readers belong to the hub of
// the client, which lives while any near cache on it does. Once the last
// per-key cache is closed nothing reads through them, yet their
// connections stay open (and Redis keeps tracking what they read, sending
// its invalidations to the subscribed connection) for as long as another
// near cache, strict here, uses the client.
func TestClosingAPerKeyCacheClosesItsReaders(t *testing.T) {
	srv := redistest.PrivateServer(t, "it counts the readers' connections of the server")
	admin := redistest.Client(t, srv.Addr)
	rdb := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p+"a:")
	strict, _ := newNearCacheOn(t, rdb, p+"s:") // the client's other near cache
	_ = strict
	perKey := New[product](rdb, WithPrefix(p+"a:"), WithNearCache(1<<20), WithEventualNearCache(time.Hour))
	t.Cleanup(func() { perKey.Close() })
	require.True(t, eventually(func() bool { return nearReady(perKey) }))
	require.NoError(t, perKey.Set(t.Context(), "k", product{ID: "v"}))
	warmNear(t, perKey, "k", "v")
	require.Positive(t, readerConnCount(t, admin), "no reader connection")

	require.NoError(t, perKey.Close())
	assert.True(t, eventually(func() bool { return readerConnCount(t, admin) == 0 }),
		"%d reader connections still open after the only per-key cache closed", readerConnCount(t, admin))
}

// TestPerKeyNearCacheBatchesAndTags: GetOrLoadMany's round goes through the
// readers too, so a batch fills memory and another process's write of one
// of its keys still reaches it; and a DeleteByTag elsewhere, a write of a
// version key no reader read, reaches it through the subscribed
// connection's broadcast of the versions. With a max age of an hour, only
// those invalidations can replace what memory holds.
func TestPerKeyNearCacheBatchesAndTags(t *testing.T) {
	admin, p := setup(t)
	agedRegistry(t, admin, p)
	r, ev := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithEventualNearCache(time.Hour), WithTags())
	w := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache(), WithTags())
	t.Cleanup(func() { w.Close() })
	require.True(t, r.near.perKey)
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		require.NoError(t, w.Set(t.Context(), k, product{ID: "v0"}, Tags("t")))
	}
	noLoad := func(context.Context, []string) (map[string]product, error) {
		return nil, errors.New("no load expected")
	}
	batch := func() map[string]product {
		got, err := r.GetOrLoadMany(t.Context(), keys, noLoad, Tags("t"))
		require.NoError(t, err)
		return got
	}
	require.True(t, eventually(func() bool {
		before := ev.get(EventNearHit)
		got := batch()
		return got["a"].ID == "v0" && ev.get(EventNearHit) >= before+int64(len(keys))
	}), "a batch's reads never filled memory")

	require.NoError(t, w.Set(t.Context(), "b", product{ID: "v1"}, Tags("t")))
	assert.True(t, eventually(func() bool { return batch()["b"].ID == "v1" }), "another process's write of a batch's key never reached memory")

	require.NoError(t, w.DeleteByTag(t.Context(), "t"))
	assert.True(t, eventually(func() bool {
		_, err := r.GetOrLoad(t.Context(), "a", func(context.Context) (product, error) { return product{ID: "reloaded"}, nil }, Tags("t"))
		v, _ := r.Get(t.Context(), "a")
		return err == nil && v.ID == "reloaded"
	}), "a DeleteByTag in another process never reached memory")
}
