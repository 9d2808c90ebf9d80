// This file proves DeleteByTag and Clear on a real 3-master
// cluster: values tagged on every master, served from a near cache, are
// gone for every read that begins after either returned, including while
// the slot of the tag versions moves to another master.
package reliability_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
)

func TestClusterDeleteByTagAndClear(t *testing.T) {
	t.Parallel()
	const masters = 3
	cl := startCluster(t, masters)
	ctx := context.Background()
	p := "tags" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	keys := keysOnEveryMaster(p, masters, 3)
	var source sync.Map // key -> round: the database
	for _, k := range keys {
		source.Store(k, 0)
	}
	var nearHits, loads atomic.Int64
	opts := []cache.Option{cache.WithPrefix(p), cache.WithTags(), cache.WithNearCache(1 << 20), cache.WithNearMaxAge(nearMaxAge)}
	reader := cache.New[int](cl.client(t), append(opts, cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearHit {
			nearHits.Add(1)
		}
	}))...)
	t.Cleanup(func() { reader.Close() })
	writer := cache.New[int](cl.client(t), opts...)
	t.Cleanup(func() { writer.Close() })
	load := func(k string) func(context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			loads.Add(1)
			cache.AddTags(ctx, "all", "slot:"+strconv.Itoa(int(slot(p+k))))
			v, _ := source.Load(k)
			return v.(int), nil
		}
	}

	// The reader serves every key in a loop; a read that begins after a
	// delete returned and gets a value of an older round is stale.
	var (
		deleted     atomic.Int64 // the round whose delete returned last
		deletedAt   atomic.Int64 // when, Unix ns
		stop        atomic.Bool
		stale, errs atomic.Int64
		readersDone sync.WaitGroup
	)
	for g := range 2 {
		readersDone.Go(func() {
			for i := g; !stop.Load(); i++ {
				k := keys[i%len(keys)]
				r, at := deleted.Load(), deletedAt.Load()
				begun := time.Now().UnixNano()
				v, err := reader.GetOrLoad(ctx, k, load(k))
				switch {
				case err != nil:
					errs.Add(1)
				case int64(v) < r && begun > at:
					stale.Add(1)
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
	for round := 1; round <= 6; round++ {
		hits := nearHits.Load()
		eventually(t, 10*time.Second, "the reader serves from memory", func() bool { return nearHits.Load() > hits+int64(5*len(keys)) })
		if round == 4 { // the versions' slot moves to another master
			s := slot(p) // the versions live in the prefix's slot
			from := cl.owner(s, masters)
			cl.moveSlot(t, s, from, (from+1)%masters, masters)
		}
		for _, k := range keys {
			source.Store(k, round)
		}
		var err error
		if round%2 == 1 {
			err = writer.DeleteByTag(ctx, "all")
		} else {
			err = writer.Clear(ctx)
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		deletedAt.Store(time.Now().UnixNano())
		deleted.Store(int64(round))
	}
	hits := nearHits.Load()
	eventually(t, 10*time.Second, "the reader serves from memory after the last delete", func() bool { return nearHits.Load() > hits+int64(5*len(keys)) })
	stop.Store(true)
	readersDone.Wait()
	t.Logf("%d near hits, %d loads, %d stale reads, %d errors", nearHits.Load(), loads.Load(), stale.Load(), errs.Load())
	if stale.Load() > 0 {
		t.Errorf("%d reads began after DeleteByTag or Clear returned and got a value it removed", stale.Load())
	}
	if n := loads.Load(); n < int64(7*len(keys)) {
		t.Errorf("%d loads for %d keys over 6 deletes: values were not removed", n, len(keys))
	}
}
