// This file runs GetOrLoadMany through redis.ClusterClient on a
// real 3-master Redis Cluster, with keys in many slots: its pipelines are
// split by node (one round trip per master and step), and several processes
// batching overlapping keys load each cold key once.
package reliability_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// batchSource is a loadMany that counts its calls and its loads per key.
type batchSource struct {
	mu     sync.Mutex // protects calls, perKey
	calls  [][]string
	perKey map[string]int
	delay  time.Duration
}

func (s *batchSource) loadMany(ctx context.Context, keys []string) (map[string]string, error) {
	s.mu.Lock()
	s.calls = append(s.calls, slices.Clone(keys))
	if s.perKey == nil {
		s.perKey = map[string]int{}
	}
	for _, k := range keys {
		s.perKey[k]++
	}
	s.mu.Unlock()
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m := make(map[string]string, len(keys))
	for _, k := range keys {
		m[k] = "v:" + k
	}
	return m, nil
}

func (s *batchSource) snapshot() ([][]string, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls), maps.Clone(s.perKey)
}

func TestClusterGetOrLoadMany(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	admin := cl.client(t)
	p := redistest.Prefix(t, admin)
	ctx := context.Background()

	const n = 60
	keys := make([]string, n)
	masters := map[string]bool{}
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		node, err := admin.MasterForKey(ctx, p+keys[i])
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("keys on %d masters; want 3", len(masters))
	}

	// One process, counted per node: a warm-up batch loads the scripts on
	// every master (NOSCRIPT, SCRIPT LOAD, sent again), then a batch of n
	// keys of which 10% are cold.
	hook := &redistest.Recorder{}
	addrs := make([]string, len(cl.nodes))
	for i, node := range cl.nodes {
		addrs[i] = node.Addr
	}
	counted := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = counted.Close() })
	counted.OnNewNode(func(rdb *redis.Client) { rdb.AddHook(hook) })
	// Without a near cache: its lease renewal is a script round trip too.
	c := cache.New[string](counted, cache.WithPrefix(p), cache.WithFailurePolicy(cache.FailClosed), cache.WithoutNearCache())
	t.Cleanup(func() { _ = c.Close() })
	warm := make([]string, 30)
	for i := range warm {
		warm[i] = "warm" + strconv.Itoa(i)
	}
	if _, err := c.GetOrLoadMany(ctx, warm, (&batchSource{}).loadMany); err != nil {
		t.Fatalf("warm-up batch: %v", err)
	}
	var cold []string
	for i, k := range keys {
		if i%10 == 7 {
			cold = append(cold, k)
			continue
		}
		if err := c.Set(ctx, k, "v:"+k); err != nil {
			t.Fatal(err)
		}
	}
	hook.Reset()
	src := &batchSource{}
	got, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
	if err != nil {
		t.Fatalf("GetOrLoadMany across slots: %v", err)
	}
	for _, k := range keys {
		if got[k] != "v:"+k {
			t.Errorf("GetOrLoadMany()[%q] = %q; want %q", k, got[k], "v:"+k)
		}
	}
	calls, _ := src.snapshot()
	if len(calls) != 1 || !sameSet(calls[0], cold) {
		t.Errorf("loadMany calls = %v; want one with %v", calls, cold)
	}
	if r := hook.Starting("get"); r < 1 || r > 3 {
		t.Errorf("GET round trips = %d; want one per master (at most 3)", r)
	}
	if r := hook.Starting("evalsha"); r < 2 || r > 6 {
		t.Errorf("script round trips = %d; want one read-or-lock and one commit per master with cold keys (2..6)", r)
	}
	for _, k := range cold {
		if v := stored(t, admin, p+k); v != `"v:`+k+`"` {
			t.Errorf("stored(%q) = %s", k, v)
		}
	}
	t.Logf("figures: %d keys on 3 masters, %d cold: round trips GET=%d EVALSHA=%d, loadMany calls=%d",
		n, len(cold), hook.Starting("get"), hook.Starting("evalsha"), len(calls))

	// Three processes, two callers each, batching overlapping windows of the
	// cold keys (deleted first) plus new ones: each key is loaded once.
	if err := c.Delete(ctx, cold...); err != nil {
		t.Fatal(err)
	}
	fresh := append(slices.Clone(cold), "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9")
	cs := make([]*cache.Cache[string], 3)
	for i := range cs {
		cs[i] = cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithFailurePolicy(cache.FailClosed),
			cache.WithRetry(200, 20*time.Millisecond))
		t.Cleanup(func() { _ = cs[i].Close() })
	}
	src = &batchSource{delay: 100 * time.Millisecond}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 6 {
		window := fresh[i%3*4 : i%3*4+8]
		wg.Go(func() {
			<-start
			got, err := cs[i%3].GetOrLoadMany(ctx, window, src.loadMany)
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
			}
			for _, k := range window {
				if got[k] != "v:"+k {
					t.Errorf("caller %d: [%q] = %q", i, k, got[k])
				}
			}
		})
	}
	close(start)
	wg.Wait()
	calls, perKey := src.snapshot()
	for _, k := range fresh {
		if perKey[k] != 1 {
			t.Errorf("loads(%q) = %d; want 1", k, perKey[k])
		}
	}
	t.Logf("figures: 3 processes x 2 callers on %d keys in overlapping windows: %d loadMany calls, each key loaded once",
		len(fresh), len(calls))
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
