// This file runs the cache on a redis.Ring of two real shards. A Ring sends each command, scripts included, to the shard of its
// first key, and hashes a key's {tag} when it has one: the lock name of a key
// holding '}' without a tag, such as "a}b:1", carries a tag of its own, so a
// script naming only the lock goes to the wrong shard.
package reliability_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// ringOf returns a Ring of the shards (name to address), closed when the
// test ends: one per simulated process.
func ringOf(t *testing.T, shards map[string]string) *redis.Ring {
	t.Helper()
	r := redis.NewRing(&redis.RingOptions{Addrs: shards})
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestRingKeysWithBraceNoTag(t *testing.T) {
	// Not parallel: its watchdog case runs on a 600ms lease.
	ctx := context.Background()
	s0, s1 := redistest.NewServer(t), redistest.NewServer(t)
	shards := map[string]string{"s0": s0.Addr, "s1": s1.Addr}
	direct := []*redis.Client{newClient(t, s0.Addr, nil), newClient(t, s1.Addr, nil)}
	probe := ringOf(t, shards)
	// shardOf finds, by writing it through the Ring, the shard of a key.
	shardOf := func(key string) int {
		t.Helper()
		if err := probe.Set(ctx, key, "probe", 0).Err(); err != nil {
			t.Fatalf("SET through the ring: %v", err)
		}
		defer probe.Del(ctx, key)
		for i, d := range direct {
			if d.Exists(ctx, key).Val() == 1 {
				return i
			}
		}
		t.Fatalf("%q is on no shard", key)
		return -1
	}
	// Keys whose lock name, routed on its own, goes to the other shard than
	// the value: the keys the bug hits.
	var keys []string
	home := map[string]int{} // the shard of each value
	for i := 0; len(keys) < 3; i++ {
		k := "a}b:" + strconv.Itoa(i)
		if home[k] = shardOf(k); home[k] != shardOf(cache.LockKey(k)) {
			keys = append(keys, k)
		}
		if i > 200 {
			t.Fatal("no key whose lock routes to the other shard")
		}
	}
	lockExists := func(k string) bool {
		for _, d := range direct {
			if d.Exists(ctx, cache.LockKey(k)).Val() == 1 {
				return true
			}
		}
		return false
	}

	t.Run("error-releases-lock", func(t *testing.T) {
		k := keys[0]
		a := cache.New[string](ringOf(t, shards))
		b := cache.New[string](ringOf(t, shards), cache.WithRetry(0, time.Millisecond)) // one attempt, no waiting
		t.Cleanup(func() { _ = a.Delete(ctx, k) })
		if _, err := a.GetOrLoad(ctx, k, func(context.Context) (string, error) { return "", errBoom }); !errors.Is(err, errBoom) {
			t.Fatalf("GetOrLoad with a failing loader = %v; want %v", err, errBoom)
		}
		if lockExists(k) {
			t.Errorf("lock of %q still held after the loader failed (default lease 5s)", k)
		}
		src := newSource(0)
		v, err := b.GetOrLoad(ctx, k, src.loader(k, "v"))
		if err != nil || v != "v" || src.loads(k) != 1 {
			t.Errorf("next caller in another process: GetOrLoad = %q, %v with %d loads; want %q from its own load at once", v, err, src.loads(k), "v")
		}
		t.Logf("figures: Ring, key %q, loader error: lock left behind=%v; next caller with no retry budget: loads=%d err=%v",
			k, lockExists(k), src.loads(k), err)
	})

	t.Run("watchdog", func(t *testing.T) {
		k := keys[1]
		// Five leases long; the lease leaves a 400ms margin for a late refresh on a busy machine.
		const lockTTL, loadFor = 600 * time.Millisecond, 3 * time.Second
		cs := make([]*cache.Cache[string], 2)
		for i := range cs {
			cs[i] = cache.New[string](ringOf(t, shards), cache.WithLockTTL(lockTTL), cache.WithRetry(300, 20*time.Millisecond))
		}
		t.Cleanup(func() { _ = cs[0].Delete(ctx, k) })
		src := newSource(loadFor)
		out := stampede(t, cs, 5, k, "v", src.loader(k, "v"))
		if out.ok != 10 {
			t.Errorf("callers: %v; want 10 ok", out)
		}
		if n := src.loads(k); n != 1 {
			t.Errorf("loads = %d; want 1 (the watchdog must extend the lease on the value's shard)", n)
		}
		t.Logf("figures: Ring, key %q, load %v with lock TTL %v, 2 procs x 5 callers: loads=%d, %v", k, loadFor, lockTTL, src.loads(k), out)
	})

	t.Run("stampede", func(t *testing.T) {
		k := keys[2]
		cs := make([]*cache.Cache[string], 3)
		for i := range cs {
			cs[i] = cache.New[string](ringOf(t, shards), cache.WithRetry(300, 20*time.Millisecond))
		}
		t.Cleanup(func() { _ = cs[0].Delete(ctx, k) })
		src := newSource(200 * time.Millisecond)
		out := stampede(t, cs, 10, k, "v", src.loader(k, "v"))
		if out.ok != 30 {
			t.Errorf("callers: %v; want 30 ok", out)
		}
		if n := src.loads(k); n != 1 {
			t.Errorf("loads = %d; want 1", n)
		}
		if lockExists(k) {
			t.Errorf("lock of %q still held after the commit", k)
		}
		if got := stored(t, direct[home[k]], k); got != `"v"` {
			t.Errorf("value on its shard = %s; want %q", got, `"v"`)
		}
		t.Logf("figures: Ring, key %q, 3 procs x 10 callers: loads=%d, %v", k, src.loads(k), out)
	})
}
