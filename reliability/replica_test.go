// This file proves read-after-Delete on a cluster client that routes
// reads to replicas (ReadOnly, RouteRandomly) while the replicas lag: the
// cache reads from masters whatever the client's routing.
package reliability_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
)

// replicated starts a cluster of one master with every slot and one
// replica; it returns the nodes' addresses and a connection to the replica
// that may read from it (READONLY).
func replicated(t *testing.T) (*cluster, []string, *redis.Conn) {
	t.Helper()
	cl := startCluster(t, 1, 0)
	replica := cl.rdbs[1].Conn()
	t.Cleanup(func() { _ = replica.Close() })
	if err := replica.ReadOnly(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return cl, []string{cl.nodes[0].Addr, cl.nodes[1].Addr}, replica
}

func TestReplicaRoutingKeepsReadAfterDelete(t *testing.T) {
	t.Parallel()
	cl, addrs, replica := replicated(t)
	ctx := context.Background()
	for _, rt := range []struct {
		name   string
		opt    redis.ClusterOptions
		opts   []cache.Option
		weaker bool // WithReplicaReads: old values are expected, and counted
	}{
		{"ReadOnly", redis.ClusterOptions{Addrs: addrs, ReadOnly: true}, nil, false},
		{"RouteRandomly", redis.ClusterOptions{Addrs: addrs, RouteRandomly: true}, nil, false},
		{"ReadOnly+WithReplicaReads", redis.ClusterOptions{Addrs: addrs, ReadOnly: true}, []cache.Option{cache.WithReplicaReads()}, true},
	} {
		t.Run(rt.name, func(t *testing.T) {
			rdb := redis.NewClusterClient(&rt.opt)
			t.Cleanup(func() { _ = rdb.Close() })
			reader := cache.New[string](rdb, rt.opts...)
			writer := cache.New[string](cl.client(t))
			const n = 40
			keys := make([]string, n)
			for i := range keys {
				keys[i] = "replica:" + rt.name + ":" + strconv.Itoa(i)
				if err := writer.Set(ctx, keys[i], "old"); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 10*time.Second, "the replica has every key", func() bool {
				for _, k := range keys {
					if replica.Exists(ctx, k).Val() != 1 {
						return false
					}
				}
				return true
			})
			// The replica stops applying the master's writes and goes on
			// serving reads: it lags.
			if err := replica.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
				t.Fatalf("CLIENT PAUSE WRITE on the replica: %v", err)
			}
			t.Cleanup(func() { replica.Do(context.Background(), "CLIENT", "UNPAUSE") })

			// Half deleted, half replaced; then every key read at once (the
			// reads batch), and each alone.
			for i, k := range keys {
				var err error
				if i%2 == 0 {
					err = writer.Delete(ctx, k)
				} else {
					err = writer.Set(ctx, k, "new")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			var stale, errs atomic.Int64
			check := func(k string, v string, err error) {
				switch {
				case err != nil:
					errs.Add(1)
					t.Logf("GetOrLoad(%q): %v", k, err)
				case v == "old":
					stale.Add(1)
				}
			}
			var wg sync.WaitGroup
			for _, k := range keys {
				wg.Go(func() {
					v, err := reader.GetOrLoad(ctx, k, func(context.Context) (string, error) { return "new", nil })
					check(k, v, err)
				})
			}
			wg.Wait()
			for i, k := range keys {
				if i%2 == 1 {
					v, err := reader.Get(ctx, k)
					check(k, v, err)
				}
			}
			lagging := 0
			for _, k := range keys {
				if v, _ := replica.Get(ctx, k).Result(); v != "" {
					lagging++ // still the old record on the replica
				}
			}
			if lagging == 0 {
				t.Fatal("the replica did not lag: the test proves nothing")
			}
			if rt.weaker {
				// The guarantee WithReplicaReads states: reads served by the
				// lagging replica are old.
				t.Logf("WithReplicaReads: %d reads of %d old while the replica lagged", stale.Load(), n+n/2)
				if stale.Load() == 0 || errs.Load() != 0 {
					t.Errorf("WithReplicaReads: %d reads old, %d failed; want reads served by the replica (old) and none failed", stale.Load(), errs.Load())
				}
				// Once the replica has caught up, no read is old: the near
				// cache kept none of the replica's copies, which were older
				// than the invalidations the process had already seen.
				if err := replica.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
					t.Fatal(err)
				}
				if got, err := cl.rdbs[0].Do(ctx, "WAIT", 1, 10000).Int(); err != nil || got != 1 {
					t.Fatalf("WAIT for the replica: %d, %v", got, err)
				}
				stale.Store(0)
				for _, k := range keys {
					v, err := reader.GetOrLoad(ctx, k, func(context.Context) (string, error) { return "new", nil })
					check(k, v, err)
				}
				if stale.Load() != 0 || errs.Load() != 0 {
					t.Errorf("after the replica caught up: %d reads of %d old, %d failed; want 0 (memory kept a replica's old copy)", stale.Load(), n, errs.Load())
				}
				return
			}
			if stale.Load() != 0 || errs.Load() != 0 {
				t.Errorf("%d reads of %d returned the old value and %d failed after Delete/Set returned; want 0 (the replica still had %d old records)",
					stale.Load(), n+n/2, errs.Load(), lagging)
			}
		})
	}
}

// The tag versions are read from masters too: a ReadOnly or RouteRandomly
// client whose replica has not seen a DeleteByTag (it lags) must not find
// the removed values current there.
func TestReplicaRoutingKeepsReadAfterDeleteByTag(t *testing.T) {
	t.Parallel()
	cl, addrs, replica := replicated(t)
	ctx := context.Background()
	for _, rt := range []struct {
		name string
		opt  redis.ClusterOptions
	}{
		{"ReadOnly", redis.ClusterOptions{Addrs: addrs, ReadOnly: true}},
		{"RouteRandomly", redis.ClusterOptions{Addrs: addrs, RouteRandomly: true}},
	} {
		t.Run(rt.name, func(t *testing.T) {
			rdb := redis.NewClusterClient(&rt.opt)
			t.Cleanup(func() { _ = rdb.Close() })
			prefix := "tagged:" + rt.name + ":"
			reader := cache.New[string](rdb, cache.WithPrefix(prefix), cache.WithTags())
			defer reader.Close()
			writer := cache.New[string](cl.client(t), cache.WithPrefix(prefix), cache.WithTags())
			defer writer.Close()
			const n = 20
			keys := make([]string, n)
			for i := range keys {
				keys[i] = strconv.Itoa(i)
				if err := writer.Set(ctx, keys[i], "old", cache.Tags("t")); err != nil {
					t.Fatal(err)
				}
			}
			if err := writer.Clear(ctx); err != nil { // the version keys exist, and the replica has them
				t.Fatal(err)
			}
			for _, k := range keys {
				if err := writer.Set(ctx, k, "old", cache.Tags("t")); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 10*time.Second, "the replica has every key", func() bool {
				for _, k := range keys {
					if replica.Exists(ctx, prefix+k).Val() != 1 {
						return false
					}
				}
				return true
			})
			if err := replica.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
				t.Fatalf("CLIENT PAUSE WRITE on the replica: %v", err)
			}
			t.Cleanup(func() { replica.Do(context.Background(), "CLIENT", "UNPAUSE") })
			if err := writer.DeleteByTag(ctx, "t"); err != nil {
				t.Fatal(err)
			}
			old := 0
			for i, k := range keys {
				var v string
				var err error
				if i%2 == 0 {
					v, err = reader.GetOrLoad(ctx, k, func(context.Context) (string, error) { return "new", nil })
				} else if v, err = reader.Get(ctx, k); errors.Is(err, cache.ErrCacheMiss) {
					v, err = "new", nil
				}
				if err != nil {
					t.Fatalf("%q: %v", k, err)
				}
				if v == "old" {
					old++
				}
			}
			if old != 0 {
				t.Errorf("%d reads of %d got a value DeleteByTag had removed (the replica lags)", old, n)
			}
		})
	}
}
