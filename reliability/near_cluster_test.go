// This file proves the near cache on a real 3-master cluster: one
// invalidation connection per master, writes on every master reach another
// instance's memory before Set returns (strict coherence: the marker is
// published through the cluster bus to every master), and a slot that
// migrates to another master while its keys are in memory and being
// written loses none of its invalidations.
package reliability_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

func TestClusterNearCacheAcrossInstancesAndMigration(t *testing.T) {
	t.Parallel()
	const masters = 3
	cl := startCluster(t, masters)
	ctx := context.Background()
	p := "near" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	keys, tag := migrationKeys(p, masters, 6)
	var nearHits, drops atomic.Int64
	opts := []cache.Option{cache.WithPrefix(p), cache.WithNearCache(1 << 20), cache.WithNearMaxAge(nearMaxAge)}
	reader := cache.New[string](cl.client(t), append(opts, cache.WithObserver(func(e cache.Event) {
		switch e.Kind {
		case cache.EventNearHit:
			nearHits.Add(1)
		case cache.EventNearDrop:
			drops.Add(1)
		}
	}))...)
	t.Cleanup(func() { reader.Close() })
	var leaseWaits atomic.Int64
	writer := cache.New[string](cl.client(t), append(opts, cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearLeaseWait {
			leaseWaits.Add(1)
		}
	}))...)
	t.Cleanup(func() { writer.Close() })

	// versions[k] is the latest value written, and when its Set returned.
	type written struct {
		v  string
		at time.Time
	}
	var mu sync.Mutex
	latest := map[string]written{}
	set := func(k, v string) {
		t.Helper()
		if err := writer.Set(ctx, k, v); err != nil {
			t.Fatalf("Set(%q): %v", k, err)
		}
		mu.Lock()
		latest[k] = written{v, time.Now()}
		mu.Unlock()
	}
	for _, k := range keys {
		set(k, "v0")
	}
	noLoad := func(context.Context) (string, error) { return "", context.Canceled } // every value is written by Set

	// The reader serves every key in a loop; a read that begins after a
	// Set returned and gets an older value is a stale read.
	var (
		stop        atomic.Bool
		reads       atomic.Int64
		stale       atomic.Int64
		worst       atomic.Int64
		firstErr    atomic.Value
		readersDone sync.WaitGroup
	)
	for g := range 2 {
		readersDone.Go(func() {
			for i := g; !stop.Load(); i++ {
				k := keys[i%len(keys)]
				mu.Lock()
				w := latest[k]
				mu.Unlock()
				begun := time.Now()
				v, err := reader.GetOrLoad(ctx, k, noLoad)
				reads.Add(1)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				if round(v) < round(w.v) && begun.After(w.at) { // a newer one than w is fine: its Set may have returned meanwhile
					stale.Add(1)
					if late := int64(begun.Sub(w.at)); late > worst.Load() {
						worst.Store(late)
					}
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
	eventually(t, 10*time.Second, "the reader serves from memory", func() bool { return nearHits.Load() > int64(10*len(keys)) })

	// Writes on every master.
	for round := 1; round <= 3; round++ {
		for _, k := range keys {
			set(k, "v"+strconv.Itoa(round))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Migrate the tagged slot while writing its keys.
	s := slot(tag)
	from := cl.owner(s, masters)
	hitsBefore := nearHits.Load()
	to := (from + 1) % masters
	cl.moveSlot(t, s, from, to, masters)
	for round := 4; round <= 8; round++ {
		for _, k := range keys {
			set(k, "v"+strconv.Itoa(round))
		}
		time.Sleep(100 * time.Millisecond)
	}
	eventually(t, 10*time.Second, "memory serves again after the migration", func() bool { return nearHits.Load() > hitsBefore+int64(10*len(keys)) })
	waitsBefore := leaseWaits.Load()

	// Invalidations lost: every invalidation connection on every master
	// killed right before a round of writes. The writer must not return
	// while the reader's memory may hold the old values: it waits for the
	// reader's acknowledgement (once both have reconnected and the reader
	// has emptied its memory) or for its lease.
	for round := 9; round <= 11; round++ {
		for _, rdb := range cl.rdbs[:masters] {
			killNearConnsOnce(rdb)
		}
		for _, k := range keys {
			set(k, "v"+strconv.Itoa(round))
		}
		eventually(t, 10*time.Second, "memory serves again after the kill", func() bool { return nearHits.Load() > hitsBefore+int64(10*len(keys)) })
		hitsBefore = nearHits.Load()
	}
	killWaits := leaseWaits.Load() - waitsBefore
	time.Sleep(300 * time.Millisecond) // the readers read every key again
	stop.Store(true)
	readersDone.Wait()

	if e := firstErr.Load(); e != nil {
		t.Errorf("reads failed; first: %v", e)
	}
	if n := stale.Load(); n != 0 {
		t.Errorf("%d of %d reads got an older value though they began after the newer one's Set returned (latest: %v after)",
			n, reads.Load(), time.Duration(worst.Load()))
	}
	// Markers or acknowledgements that do not cross the bus make most of the
	// writes before the kills (15 initial, 120 in rounds 1 to 8) wait out the
	// reader's lease. CI saw one on a loaded machine, most likely a v0 write
	// made before the writer's own subscription was confirmed (its
	// acknowledgement lost; the writer now asks again, see
	// TestWriterAsksAgainForLostAcknowledgements); a renewal late by most of
	// a lease can still cost one. A wait costs time, never a stale read,
	// which is checked above.
	if n := waitsBefore; n > 2 {
		t.Errorf("%d writes waited out the reader's lease with every connection up: its acknowledgements did not come (markers not through the bus?)", n)
	}
	t.Logf("figures: %d keys on 3 masters (%d in slot %d, moved from master %d to %d); %d reads, %d from memory; %d drops of memory; %d lease waits before the kills, %d after; 0 stale reads wanted, got %d",
		len(keys), 6, s, from, to, reads.Load(), nearHits.Load(), drops.Load(), waitsBefore, killWaits, stale.Load())
}

// migrationKeys returns 3 keys under p on each of the masters, then
// inSlot keys of one slot, whose hash tag is tag: the slot a test moves.
func migrationKeys(p string, masters, inSlot int) (keys []string, tag string) {
	tag = "{" + p + "mig}"
	keys = keysOnEveryMaster(p, masters, 3)
	for i := range inSlot {
		keys = append(keys, tag+strconv.Itoa(i))
	}
	return keys, tag
}

// round is the write round of a value "v<round>".
func round(v string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(v, "v"))
	if err != nil {
		return -1
	}
	return n
}

// TestClusterPerKeyNearCacheAcrossMastersAndMigration: an eventual near
// cache on a 3-master cluster tracks per key, through a reader per master.
// With a max age of an hour, only invalidations can replace what memory
// holds: every write, on every master, and after a slot moved to another
// master, reaches the reader's memory within moments. (Redis reports a
// migrating key's removal from its old master to the processes that read
// it there; the next read, from the new master, is tracked there.)
func TestClusterPerKeyNearCacheAcrossMastersAndMigration(t *testing.T) {
	t.Parallel()
	const masters = 3
	cl := startCluster(t, masters)
	ctx := context.Background()
	p := "perkey" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	keys, tag := migrationKeys(p, masters, 4)
	var nearHits atomic.Int64
	reader := cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithEventualNearCache(time.Hour),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				nearHits.Add(1)
			}
		}))
	t.Cleanup(func() { reader.Close() })
	writer := cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithoutNearCache())
	t.Cleanup(func() { writer.Close() })

	// Each round: every key written, read until memory serves it, written
	// again; the reader must see the new value although memory held the old.
	check := func(round int) {
		t.Helper()
		next := warmRound(t, writer, reader, keys, round, &nearHits)
		for _, k := range keys {
			if err := writer.Set(ctx, k, next); err != nil {
				t.Fatalf("Set(%q): %v", k, err)
			}
		}
		for _, k := range keys {
			eventually(t, 5*time.Second, "the write of "+k+" reaches the reader's memory", func() bool {
				v, err := reader.Get(ctx, k)
				return err == nil && v == next
			})
		}
	}
	check(0)
	s := slot(tag)
	from := cl.owner(s, masters)
	cl.moveSlot(t, s, from, (from+1)%masters, masters)
	check(1)
	check(2)
	t.Logf("figures: %d keys on %d masters, slot %d moved; %d near hits", len(keys), masters, s, nearHits.Load())
}

// TestClusterPerKeyHoldersAcrossMastersAndMigration: a strict near cache
// with per-key holders (WithNearPerKey) on a 3-master cluster, whose
// tracking connections hear Redis 30ms late. A write's holders are read in
// each key's own slot, after the write: every Set, on every master and
// after a slot moved to another master, returns only once the reader
// dropped the old value, so a read right after it gets the new one; and no
// write waits out a lease.
func TestClusterPerKeyHoldersAcrossMastersAndMigration(t *testing.T) {
	t.Parallel()
	const masters = 3
	cl := startCluster(t, masters)
	ctx := context.Background()
	p := "holders" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	keys, tag := migrationKeys(p, masters, 4)
	var nearHits, leaseWaits atomic.Int64
	addrs := make([]string, len(cl.nodes))
	for i, n := range cl.nodes {
		addrs[i] = n.Addr
	}
	late := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: lateTracking(30 * time.Millisecond)})
	t.Cleanup(func() { _ = late.Close() })
	reader := cache.New[string](late, cache.WithPrefix(p), cache.WithNearPerKey(),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				nearHits.Add(1)
			}
		}))
	t.Cleanup(func() { reader.Close() })
	writer := cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithoutNearCache(),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearLeaseWait {
				leaseWaits.Add(1)
			}
		}))
	t.Cleanup(func() { writer.Close() })
	check := func(round int) {
		t.Helper()
		next := warmRound(t, writer, reader, keys, round, &nearHits)
		for _, k := range keys {
			if err := writer.Set(ctx, k, next); err != nil {
				t.Fatalf("Set(%q): %v", k, err)
			}
			if v, err := reader.Get(ctx, k); err != nil || v != next {
				t.Errorf("round %d: Get(%q) right after Set returned: %q, %v; want %q", round, k, v, err, next)
			}
		}
	}
	check(0)
	s := slot(tag)
	from := cl.owner(s, masters)
	cl.moveSlot(t, s, from, (from+1)%masters, masters)
	check(1)
	check(2)
	if n := leaseWaits.Load(); n != 0 {
		t.Errorf("%d writes waited out a lease with the reader running: its acknowledgements did not come", n)
	}
	t.Logf("figures: %d keys on %d masters, slot %d moved; %d near hits", len(keys), masters, s, nearHits.Load())
}

// warmRound begins a round of the per-key cluster tests: writer Sets every
// key to the round's old value, and reader reads each until its memory
// serves it (nearHits counts its near hits). It returns the round's new
// value.
func warmRound(t *testing.T, writer, reader *cache.Cache[string], keys []string, round int, nearHits *atomic.Int64) (next string) {
	t.Helper()
	ctx := context.Background()
	old := "v" + strconv.Itoa(2*round)
	for _, k := range keys {
		if err := writer.Set(ctx, k, old); err != nil {
			t.Fatalf("Set(%q): %v", k, err)
		}
	}
	for _, k := range keys {
		eventually(t, 10*time.Second, "memory serves "+k, func() bool {
			before := nearHits.Load()
			v, err := reader.Get(ctx, k)
			return err == nil && v == old && nearHits.Load() > before
		})
	}
	return "v" + strconv.Itoa(2*round+1)
}
