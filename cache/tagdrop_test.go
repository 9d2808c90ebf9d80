package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/require"
)

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
