// This file checks DeleteByTag and Clear: what they remove, what they
// keep, their promise across Caches on separate clients (processes, as far
// as Redis can tell) with near caches, and bad input.

package cache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// source is a loader's database: a value per key, and the loads counted.
type tagSource struct {
	mu    sync.Mutex
	v     map[string]int
	loads atomic.Int64
}

func (s *tagSource) set(key string, v int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.v == nil {
		s.v = map[string]int{}
	}
	s.v[key] = v
}

func (s *tagSource) loader(key string, tags ...string) func(context.Context) (product, error) {
	return func(ctx context.Context) (product, error) {
		s.loads.Add(1)
		AddTags(ctx, tags...)
		s.mu.Lock()
		defer s.mu.Unlock()
		return product{ID: key, Price: s.v[key]}, nil
	}
}

func TestDeleteByTagRemovesOnlyTaggedValues(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p), WithTags())
	defer c.Close()
	var src tagSource
	for _, k := range []string{"a", "b", "c", "d"} {
		src.set(k, 1)
	}
	// a: tagged by the call; b: by its loader; c: by Set; d: untagged.
	_, err := c.GetOrLoad(ctx, "a", src.loader("a"), Tags("cat:7", "tenant:1"))
	require.NoError(t, err)
	_, err = c.GetOrLoad(ctx, "b", src.loader("b", "cat:7"))
	require.NoError(t, err)
	require.NoError(t, c.Set(ctx, "c", product{ID: "c", Price: 1}, Tags("cat:7")))
	_, err = c.GetOrLoad(ctx, "d", src.loader("d"), Tags("cat:8"))
	require.NoError(t, err)
	for _, k := range []string{"a", "b", "c", "d"} {
		src.set(k, 2)
	}

	require.NoError(t, c.DeleteByTag(ctx, "cat:7"))
	for _, k := range []string{"a", "b", "c"} {
		got, err := c.GetOrLoad(ctx, k, src.loader(k))
		require.NoError(t, err)
		assert.Equal(t, 2, got.Price, "%s was tagged cat:7: loaded anew", k)
	}
	got, err := c.GetOrLoad(ctx, "d", src.loader("d"))
	require.NoError(t, err)
	assert.Equal(t, 1, got.Price, "d has another tag: still cached")
	_, err = c.Get(ctx, "a")
	require.NoError(t, err, "the reload is cached again")

	// Clear removes everything, tagged or not.
	src.set("d", 3)
	require.NoError(t, c.Clear(ctx))
	_, err = c.Get(ctx, "d")
	assert.ErrorIs(t, err, ErrCacheMiss)
	got, err = c.GetOrLoad(ctx, "d", src.loader("d"))
	require.NoError(t, err)
	assert.Equal(t, 3, got.Price)
}

func TestTagsNeedWithTags(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p))
	defer c.Close()
	assert.ErrorIs(t, c.DeleteByTag(ctx, "x"), ErrNoTags)
	assert.ErrorIs(t, c.DeleteByTag(ctx), ErrNoTags, "no tags: still the wrong call")
	assert.ErrorIs(t, c.Clear(ctx), ErrNoTags)
	assert.ErrorIs(t, c.Set(ctx, "k", product{}, Tags("x")), ErrNoTags)
	_, err := c.GetOrLoad(ctx, "k", (&counter{}).load, Tags("x"))
	assert.ErrorIs(t, err, ErrNoTags)
	// The same once the value is in memory: the call is wrong either way.
	_, err = c.GetOrLoad(ctx, "m", (&counter{}).load)
	require.NoError(t, err)
	waitFor(t, func() bool {
		_, _ = c.GetOrLoad(ctx, "m", (&counter{}).load)
		return c.Stats().NearHits > 0
	})
	_, err = c.GetOrLoad(ctx, "m", (&counter{}).load, Tags("x"))
	assert.ErrorIs(t, err, ErrNoTags, "a near hit hid the wrong call")
	_, err = c.GetOrLoadMany(ctx, []string{"k"}, func(context.Context, []string) (map[string]product, error) { return nil, nil }, Tags("x"))
	assert.ErrorIs(t, err, ErrNoTags)

	// A loader's AddTags on such a Cache: the value is returned, not stored
	// untagged (a DeleteByTag elsewhere would miss it).
	var added bool
	v, err := c.GetOrLoad(ctx, "k", func(ctx context.Context) (product, error) {
		added = AddTags(ctx, "x")
		return product{ID: "k"}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, "k", v.ID)
	assert.False(t, added)
	_, err = c.Get(ctx, "k")
	assert.ErrorIs(t, err, ErrCacheMiss)

	tc := New[product](rdb, WithPrefix(p+"t:"), WithTags())
	defer tc.Close()
	assert.ErrorContains(t, tc.DeleteByTag(ctx, "ok", ""), "empty tag")
	gone, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, tc.DeleteByTag(gone), context.Canceled, "a caller who left, even with no tags")
	assert.ErrorContains(t, tc.Set(ctx, "k", product{}, Tags("")), "empty tag")
	// The version keys are not keys a caller may use.
	_, err = tc.Get(ctx, strings.TrimPrefix(tc.tags.Key("ok"), tc.cfg.prefix))
	assert.ErrorIs(t, err, ErrReservedKey)
	assert.False(t, AddTags(ctx, "x"), "outside a loader")
}

// Two Caches on separate clients stand for two processes: a reader serving
// a tagged value from memory, a writer deleting the tag. No read that
// begins after DeleteByTag (or Clear) returned gets the old value, and the
// reader served from memory before.
func TestDeleteByTagEmptiesOtherNearCaches(t *testing.T) {
	addr := redistest.Addr(t)
	w := redistest.Client(t, addr)
	p := redistest.Prefix(t, w)
	ctx := context.Background()
	var nearHits atomic.Int64
	reader := New[product](redistest.Client(t, addr), WithPrefix(p), WithTags(), WithObserver(func(e Event) {
		if e.Kind == EventNearHit {
			nearHits.Add(1)
		}
	}))
	defer reader.Close()
	writer := New[product](w, WithPrefix(p), WithTags())
	defer writer.Close()
	var src tagSource
	for round, del := range []func() error{
		func() error { return writer.DeleteByTag(ctx, "t") },
		func() error { return writer.Clear(ctx) },
	} {
		key := fmt.Sprint("k", round)
		src.set(key, 1)
		require.NoError(t, writer.Set(ctx, key, product{ID: key, Price: 1}, Tags("t")))
		hits := nearHits.Load()
		waitFor(t, func() bool {
			v, err := reader.GetOrLoad(ctx, key, src.loader(key))
			return err == nil && v.Price == 1 && nearHits.Load() > hits
		})
		src.set(key, 2)
		require.NoError(t, del())
		v, err := reader.GetOrLoad(ctx, key, src.loader(key))
		require.NoError(t, err)
		assert.Equal(t, 2, v.Price, "round %d: a read after the delete returned got the old value", round)
	}
}

// A load that began before DeleteByTag commits after it returned: the
// value stays in Redis, but no read that began after the delete gets it,
// whether it joined the load's flight or read Redis afterwards.
func TestLoadBegunBeforeDeleteByTagIsNotServedAfter(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p), WithTags())
	defer c.Close()
	inLoad, release := make(chan struct{}), make(chan struct{})
	first := make(chan product, 1)
	go func() {
		v, _ := c.GetOrLoad(ctx, "k", func(ctx context.Context) (product, error) {
			close(inLoad)
			<-release
			return product{ID: "k", Price: 1}, nil // read from the source before the delete
		}, Tags("t"))
		first <- v
	}()
	<-inLoad
	require.NoError(t, c.DeleteByTag(ctx, "t"))
	late := make(chan product, 1)
	go func() {
		v, _ := c.GetOrLoad(ctx, "k", func(context.Context) (product, error) {
			return product{ID: "k", Price: 2}, nil
		}, Tags("t"))
		late <- v
	}()
	time.Sleep(20 * time.Millisecond) // let the late caller join the flight, if it can
	close(release)
	assert.Equal(t, 1, (<-first).Price, "the caller that began before the delete gets its load")
	assert.Equal(t, 2, (<-late).Price, "a caller that began after the delete returned got a value loaded before it")
	v, err := c.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, v.Price)
}

// A refresh keeps the tags of the value it replaces, though the caller
// that triggers it gives none.
func TestRefreshKeepsTags(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p), WithTags(), WithTTL(200*time.Millisecond), WithStale(time.Minute), WithoutNearCache())
	defer c.Close()
	var src tagSource
	src.set("k", 1)
	_, err := c.GetOrLoad(ctx, "k", src.loader("k"), Tags("t"))
	require.NoError(t, err)
	time.Sleep(250 * time.Millisecond) // stale now
	src.set("k", 2)
	waitFor(t, func() bool { // served stale while it refreshes, then the refreshed value
		v, err := c.GetOrLoad(ctx, "k", src.loader("k"))
		return err == nil && v.Price == 2
	})
	src.set("k", 3)
	require.NoError(t, c.DeleteByTag(ctx, "t"))
	v, err := c.GetOrLoad(ctx, "k", src.loader("k"))
	require.NoError(t, err)
	assert.Equal(t, 3, v.Price, "the refreshed value lost its tag")
}

// A record whose versions cannot be read is a miss, not a stale hit, and a
// version key holding something else is reported.
func TestUnreadableTagVersionIsAMiss(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p), WithTags(), WithoutNearCache())
	defer c.Close()
	require.NoError(t, c.Set(ctx, "k", product{ID: "k"}, Tags("t")))
	require.NoError(t, rdb.Set(ctx, c.tags.Key("t"), "garbage", time.Minute).Err())
	_, err := c.Get(ctx, "k")
	assert.ErrorIs(t, err, ErrCacheMiss)
	require.NoError(t, rdb.Del(ctx, c.tags.Key("t")).Err())
	_, err = c.Get(ctx, "k")
	assert.NoError(t, err)
}

// A Cache without WithTags still honours the stamps of a Cache with it on
// the same prefix: a tagged value deleted by tag is a miss there too.
func TestCacheWithoutTagsHonoursStamps(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	tagged := New[product](rdb, WithPrefix(p), WithTags(), WithoutNearCache())
	defer tagged.Close()
	plain := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache())
	defer plain.Close()
	require.NoError(t, tagged.Set(ctx, "k", product{ID: "k"}, Tags("t")))
	_, err := plain.Get(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, tagged.DeleteByTag(ctx, "t"))
	_, err = plain.Get(ctx, "k")
	assert.ErrorIs(t, err, ErrCacheMiss)
}

// The tag clock and versions expire 30 days after the last DeleteByTag or
// Clear. A clock that expired must not run backwards: a value stamped
// before the expiry is still removed by the next DeleteByTag of its tag.
func TestTagClockDoesNotRunBackwardsAfterExpiry(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	c := New[product](rdb, WithPrefix(p), WithTags(), WithoutNearCache())
	defer c.Close()
	require.NoError(t, c.DeleteByTag(ctx, "other")) // the clock is the server's time now
	ttl, err := rdb.PTTL(ctx, c.tags.Clock).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 29*24*time.Hour, "the clock is kept as long as the versions")
	require.NoError(t, c.Set(ctx, "k", product{ID: "k"}, Tags("t")))
	require.NoError(t, rdb.Del(ctx, c.tags.Clock, c.tags.Key("other")).Err()) // as if 30 days passed
	require.NoError(t, c.DeleteByTag(ctx, "t"))
	_, err = c.Get(ctx, "k")
	assert.ErrorIs(t, err, ErrCacheMiss, "the value stamped before the clock expired survived its tag's delete")
}

// GetOrLoadMany reads the versions of all its records in one MGET, and
// drops the values of a deleted tag among them.
func TestGetOrLoadManyReadsVersionsOnce(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	cmds := redistest.CountCommands(rdb) // before New: hooks go on a client not yet in use
	c := New[product](rdb, WithPrefix(p), WithTags(), WithoutNearCache())
	defer c.Close()
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		require.NoError(t, c.Set(ctx, keys[i], product{ID: keys[i], Price: 1}, Tags(fmt.Sprint("t", i%4))))
	}
	reload := func(_ context.Context, ks []string) (map[string]product, error) {
		m := map[string]product{}
		for _, k := range ks {
			m[k] = product{ID: k, Price: 2}
		}
		return m, nil
	}
	require.NoError(t, c.DeleteByTag(ctx, "t0"))
	before := cmds.Count("mget")
	got, err := c.GetOrLoadMany(ctx, keys, reload)
	require.NoError(t, err)
	// One for the records read, one for the clock before the load, one for
	// the values committed: not one per tagged value.
	assert.Equal(t, 3, cmds.Count("mget")-before, "versions read once per step of the batch")
	for i, k := range keys {
		want := 1
		if i%4 == 0 {
			want = 2 // tagged t0: deleted, loaded anew
		}
		assert.Equal(t, want, got[k].Price, k)
	}
}

// Without a near cache, a read of a tagged value on a single server reads
// the versions with the value, in one MGET, once it knows the value's tags
// (from its last read); a DeleteByTag in between is seen all the same, and
// a value whose tags changed is checked against its new ones.
func TestTaggedReadIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	ctx := context.Background()
	cmds := redistest.CountCommands(rdb) // before New: hooks go on a client not yet in use
	c := New[product](rdb, WithPrefix(p), WithTags(), WithoutNearCache())
	defer c.Close()
	require.NoError(t, c.Set(ctx, "k", product{ID: "k", Price: 1}, Tags("a", "b")))
	_, err := c.Get(ctx, "k") // learns k's tags: a second MGET for them
	require.NoError(t, err)
	for range 3 {
		reads := func() int { return cmds.Count("get") + cmds.Count("mget") }
		before := reads()
		got, err := c.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, 1, got.Price)
		assert.Equal(t, 1, reads()-before, "a tagged hit took more than one read")
	}
	require.NoError(t, c.DeleteByTag(ctx, "b"))
	_, err = c.Get(ctx, "k")
	assert.ErrorIs(t, err, ErrCacheMiss, "a value deleted by tag was served")

	// Tags changed since the last read: checked against the new ones.
	require.NoError(t, c.Set(ctx, "k", product{ID: "k", Price: 2}, Tags("c")))
	got, err := c.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, got.Price)
	require.NoError(t, c.DeleteByTag(ctx, "c"))
	_, err = c.Get(ctx, "k")
	assert.ErrorIs(t, err, ErrCacheMiss, "a value deleted by its new tag was served")
	src := &tagSource{}
	src.set("k", 3)
	v, err := c.GetOrLoad(ctx, "k", src.loader("k", "c"))
	require.NoError(t, err)
	assert.Equal(t, 3, v.Price, "the reload")
}

// A prefix with a stray '{' (its version keys once began elsewhere, so the
// near caches were never told of them, and not even the Cache that ran
// DeleteByTag or Clear emptied its memory): both remove the value from
// memory and from Redis, here and in another process's near cache.
func TestDeleteByTagUnderAPrefixWithAStrayBrace(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	ctx := t.Context()
	addr := redistest.Addr(t)
	c, ev := newNearCacheOn(t, redistest.Client(t, addr), p+"a{b:", WithTags())
	other, oev := newNearCacheOn(t, redistest.Client(t, addr), p+"a{b:", WithTags())
	var src tagSource
	for round, clear := range []bool{false, true} {
		src.set("k", 10*round+1)
		require.True(t, eventually(func() bool {
			for _, cc := range []*Cache[product]{c, other} {
				if _, err := cc.GetOrLoad(ctx, "k", src.loader("k", "t"), Tags("t")); err != nil {
					return false
				}
			}
			return nearHas(c, "k") && nearHas(other, "k")
		}), "never in memory")
		hits, ohits := ev.get(EventNearHit), oev.get(EventNearHit)
		for _, cc := range []*Cache[product]{c, other} {
			_, err := cc.GetOrLoad(ctx, "k", src.loader("k", "t"))
			require.NoError(t, err)
		}
		require.Greater(t, ev.get(EventNearHit), hits)
		require.Greater(t, oev.get(EventNearHit), ohits)
		src.set("k", 10*round+2)
		if clear {
			require.NoError(t, c.Clear(ctx))
		} else {
			require.NoError(t, c.DeleteByTag(ctx, "t"))
		}
		for name, cc := range map[string]*Cache[product]{"the Cache that deleted": c, "another process": other} {
			v, err := cc.GetOrLoad(ctx, "k", src.loader("k", "t"))
			require.NoError(t, err)
			assert.Equal(t, 10*round+2, v.Price, "%s (clear=%v) got the removed value", name, clear)
		}
		v, err := other.GetOrLoad(ctx, "k", src.loader("k", "t"), SkipNear())
		require.NoError(t, err)
		assert.Equal(t, 10*round+2, v.Price)
	}
}

// This file checks that Clear reaches near caches: its own process's,
// through the version key it writes, and another process's, through the
// invalidation Redis sends for that key.
// nearServed waits until c serves key from memory with price.
func nearServed(t *testing.T, c *Cache[product], hits *atomic.Int64, key string, price int, src *tagSource) {
	t.Helper()
	before := hits.Load()
	waitFor(t, func() bool {
		v, err := c.GetOrLoad(context.Background(), key, src.loader(key))
		return err == nil && v.Price == price && hits.Load() > before
	})
}

// countNearHits is an observer that counts near hits.
func countNearHits(n *atomic.Int64) Option {
	return WithObserver(func(e Event) {
		if e.Kind == EventNearHit {
			n.Add(1)
		}
	})
}

// One process: a value served from memory, untagged, is not served after
// Clear returned. Clear writes only its version key: the near cache must
// take that key for one every value depends on.
func TestClearEmptiesItsOwnNearCache(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	var hits atomic.Int64
	c := New[product](rdb, WithPrefix(p), WithTags(), countNearHits(&hits))
	defer c.Close()
	var src tagSource
	for round := range 2 {
		src.set("k", round)
		nearServed(t, c, &hits, "k", round, &src)
		src.set("k", round+1)
		require.NoError(t, c.Clear(ctx))
		v, err := c.GetOrLoad(ctx, "k", src.loader("k"))
		require.NoError(t, err)
		assert.Equal(t, round+1, v.Price, "round %d: a read after Clear returned got the value from before", round)
	}
}

// Two processes (Caches on separate clients): a value the reader serves
// from memory, untagged, is not served after the writer's Clear returned,
// nor is the reader's copy of a value it loaded itself.
func TestClearEmptiesOtherNearCaches(t *testing.T) {
	addr := redistest.Addr(t)
	w := redistest.Client(t, addr)
	p := redistest.Prefix(t, w)
	ctx := context.Background()
	var hits atomic.Int64
	reader := New[product](redistest.Client(t, addr), WithPrefix(p), WithTags(), countNearHits(&hits))
	defer reader.Close()
	writer := New[product](w, WithPrefix(p), WithTags())
	defer writer.Close()
	var src tagSource
	for round := range 2 {
		src.set("set", round)
		src.set("loaded", round)
		require.NoError(t, writer.Set(ctx, "set", product{ID: "set", Price: round}))
		nearServed(t, reader, &hits, "set", round, &src)
		nearServed(t, reader, &hits, "loaded", round, &src)
		src.set("set", round+1)
		src.set("loaded", round+1)
		require.NoError(t, writer.Clear(ctx))
		for _, key := range []string{"set", "loaded"} {
			v, err := reader.GetOrLoad(ctx, key, src.loader(key))
			require.NoError(t, err)
			assert.Equal(t, round+1, v.Price, "round %d: %s: a read after Clear returned elsewhere got the value from before", round, key)
		}
	}
}

// warmTagged reads key through c until a read is served from memory.
func warmTagged(t *testing.T, c *Cache[product], ev *events, key string, load func(context.Context) (product, error)) {
	t.Helper()
	require.True(t, eventually(func() bool {
		hits := ev.get(EventNearHit)
		_, err := c.GetOrLoad(t.Context(), key, load)
		return err == nil && ev.get(EventNearHit) > hits
	}), "%s never served from memory", key)
}

// TestDeleteByTagDropsOnlyItsTagFromNearCaches: DeleteByTag(T) drops from
// every near cache, the writer's own and another process's, the entries
// that carry T, and only those: an entry with another tag, or none, is
// still served from memory; an entry with T is never served after it
// returned.
func TestDeleteByTagDropsOnlyItsTagFromNearCaches(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	p := redistest.Prefix(t, redistest.Client(t, addr))
	ctx := t.Context()
	writer, _, wev := newNearCache(t, p, WithTags(), WithNearMaxAge(time.Minute))
	reader, _, rev := newNearCache(t, p, WithTags(), WithNearMaxAge(time.Minute))
	var src tagSource
	keys := map[string][]string{"withT": {"T"}, "withTU": {"T", "U"}, "withU": {"U"}, "untagged": nil}
	for round := range 3 {
		for k, tags := range keys {
			src.set(k, round)
			for _, c := range []struct {
				c  *Cache[product]
				ev *events
			}{{writer, wev}, {reader, rev}} {
				warmTagged(t, c.c, c.ev, k, src.loader(k, tags...))
			}
		}
		// Once more, after the invalidations of the loads' commits arrived
		// (one may land after the read that filled memory, and drop it).
		time.Sleep(50 * time.Millisecond)
		for k, tags := range keys {
			warmTagged(t, writer, wev, k, src.loader(k, tags...))
			warmTagged(t, reader, rev, k, src.loader(k, tags...))
		}
		for k := range keys {
			src.set(k, round+100)
		}
		require.NoError(t, writer.DeleteByTag(ctx, "T"))
		for name, c := range map[string]*Cache[product]{"writer": writer, "reader": reader} {
			for k, tags := range keys {
				hasT := len(tags) > 0 && tags[0] == "T"
				if got := nearHas(c, k); got == hasT {
					ev := map[string]*events{"writer": wev, "reader": rev}[name]
					t.Errorf("round %d, %s: %s in memory after DeleteByTag(T) = %v; want %v (drops %d, invalidations %d, evictions %d)", round, name, k, got, !hasT,
						ev.get(EventNearDrop), ev.get(EventNearInvalidation), ev.get(EventNearEviction))
				}
				v, err := c.GetOrLoad(ctx, k, src.loader(k, tags...))
				require.NoError(t, err)
				want := round
				if hasT {
					want = round + 100
				}
				if v.Price != want {
					t.Errorf("round %d, %s: %s = %d after DeleteByTag(T); want %d", round, name, k, v.Price, want)
				}
			}
		}
		// Clear still drops everything.
		require.NoError(t, writer.Clear(ctx))
		for k := range keys {
			if nearHas(reader, k) || nearHas(writer, k) {
				t.Errorf("round %d: %s still in memory after Clear", round, k)
			}
		}
	}
}

// TestDeleteByTagNearHitRatio logs the near hit ratio of a reader of 100
// keys in 10 tags while another process deletes one tag between rounds of
// reads (a reprice): only the keys of the deleted tag are read from Redis
// again. The bound is loose: it fails only when a DeleteByTag empties
// memory.
func TestDeleteByTagNearHitRatio(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	p := redistest.Prefix(t, redistest.Client(t, addr))
	ctx := t.Context()
	writer := New[product](redistest.Client(t, addr), WithPrefix(p), WithTags(), WithoutNearCache())
	t.Cleanup(func() { writer.Close() })
	reader, _, ev := newNearCache(t, p, WithTags(), WithNearMaxAge(time.Minute))
	var src tagSource
	const keys, tags, rounds = 100, 10, 30
	loader := func(i int) func(context.Context) (product, error) {
		return src.loader(fmt.Sprint("k", i), fmt.Sprint("cat", i%tags))
	}
	for i := range keys { // warm: every key in memory
		warmTagged(t, reader, ev, fmt.Sprint("k", i), loader(i))
	}
	hits0, reads := ev.get(EventNearHit), 0
	for range rounds {
		require.NoError(t, writer.DeleteByTag(ctx, fmt.Sprint("cat", rand.IntN(tags))))
		for i := range keys {
			_, err := reader.GetOrLoad(ctx, fmt.Sprint("k", i), loader(i))
			require.NoError(t, err)
			reads++
		}
	}
	ratio := float64(ev.get(EventNearHit)-hits0) / float64(reads)
	t.Logf("near hit ratio with one DeleteByTag of %d tags between reads of %d keys: %.0f%% (%d reads)", tags, keys, 100*ratio, reads)
	if ratio < 0.5 {
		t.Errorf("near hit ratio %.2f: DeleteByTag of one tag in %d dropped more than its keys", ratio, tags)
	}
}

// TestDeleteByTagRacingNearReaders: readers serve a tagged value from
// memory in a loop while another Cache changes its source and deletes its
// tag, round after round; no read that began after a DeleteByTag returned
// gets a value older than that round's, while a value with another tag
// stays in memory throughout.
func TestDeleteByTagRacingNearReaders(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	p := redistest.Prefix(t, redistest.Client(t, addr))
	ctx := t.Context()
	reader, _, ev := newNearCache(t, p, WithTags(), WithNearMaxAge(time.Minute))
	writer := New[product](redistest.Client(t, addr), WithPrefix(p), WithTags())
	t.Cleanup(func() { writer.Close() })
	var src tagSource
	src.set("t", 0)
	src.set("u", 0)
	warmTagged(t, reader, ev, "u", src.loader("u", "U"))
	var (
		returned     atomic.Int64 // the last round whose DeleteByTag returned
		stop         atomic.Bool
		reads, stale atomic.Int64
		wg           sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				want := returned.Load()
				v, err := reader.GetOrLoad(ctx, "t", src.loader("t", "T"))
				reads.Add(1)
				if err == nil && int64(v.Price) < want {
					stale.Add(1)
				}
			}
		})
	}
	const rounds = 50
	for r := 1; r <= rounds; r++ {
		src.set("t", r)
		require.NoError(t, writer.DeleteByTag(ctx, "T"))
		returned.Store(int64(r))
		time.Sleep(2 * time.Millisecond) // let the readers fill memory again
	}
	stop.Store(true)
	wg.Wait()
	hits := ev.get(EventNearHit)
	_, err := reader.GetOrLoad(ctx, "u", src.loader("u", "U"))
	require.NoError(t, err)
	t.Logf("%d reads across %d DeleteByTag, %d near hits, %d stale", reads.Load(), rounds, hits, stale.Load())
	if stale.Load() > 0 {
		t.Errorf("%d reads began after a DeleteByTag returned and got an older value", stale.Load())
	}
	if ev.get(EventNearHit) != hits+1 {
		t.Error("the value tagged U left memory during the DeleteByTag of T")
	}
}

// TestTagsOutageKeepsOffRedis: with tags, once the breaker is open, a
// GetOrLoad costs no dial (the tag clock's read goes through the breaker
// too) and reaches the error hook no more: the opening was reported.
func TestTagsOutageKeepsOffRedis(t *testing.T) {
	t.Parallel()
	rdb, dials := dialCounter(t, deadAddr(t))
	var hooks, redisErrs atomic.Int64
	c := New[product](rdb, WithTags(), WithoutNearCache(), WithCircuitBreaker(2, time.Hour),
		WithErrorHook(func(string, error) { hooks.Add(1) }),
		WithObserver(func(e Event) {
			if e.Kind == EventRedisError {
				redisErrs.Add(1)
			}
		}))
	defer c.Close()
	src := &counter{}
	for i := 0; !c.Stats().BreakerOpen; i++ {
		require.Less(t, i, 10, "the breaker never opened")
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	d0, h0, e0, l0 := dials.Load(), hooks.Load(), redisErrs.Load(), src.calls.Load()
	for range 100 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load, Tags("t"))
		require.NoError(t, err)
	}
	assert.Equal(t, l0+100, src.calls.Load(), "FailOpen loads each call, uncached")
	assert.Equal(t, d0, dials.Load(), "no dial while the breaker is open")
	assert.Equal(t, h0, hooks.Load(), "the error hook heard of the outage already")
	assert.Equal(t, e0, redisErrs.Load(), "no Redis call, no Redis error")
	assert.LessOrEqual(t, h0, int64(2*2), "before it opened: one report per failed call at most")

	err := c.Set(t.Context(), "k", product{ID: "1"}, Tags("t"))
	require.True(t, errors.Is(err, ErrCircuitOpen), "Set: %v", err)
	assert.Equal(t, d0, dials.Load(), "no dial for a Set either")
}

// Clear empties the near caches as a write, reported as EventNearInvalidation;
// EventNearDrop stays the sign that invalidations could have been missed,
// which an alert can watch.
func TestClearIsNoNearDrop(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, ev := newNearCache(t, p, WithTags())
	require.True(t, eventually(func() bool { return fillNear(t, c, "k") }), "a value never reached memory")
	drops, invalidations := ev.get(EventNearDrop), ev.get(EventNearInvalidation)
	require.NoError(t, c.Clear(t.Context()))
	assert.False(t, nearHas(c, "k"), "Clear left the value in memory")
	assert.True(t, eventually(func() bool { return ev.get(EventNearInvalidation) > invalidations }), "Clear was not reported as an invalidation")
	assert.Equal(t, drops, ev.get(EventNearDrop), "Clear was reported as a drop: invalidations that could have been missed")
}
