// This file wakes waiters by notification on a real 3-master
// Redis Cluster: keys in slots of every master, one sharded subscription
// per master for all of them.
package reliability_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// scriptsPerKey counts the script calls of a client by the key they name
// (the value key is the first) and calls after(key, n) once the n-th reply
// has come back.
type scriptsPerKey struct {
	mu    sync.Mutex
	n     map[string]int
	after func(key string, n int)
}

func (h *scriptsPerKey) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptsPerKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() != "evalsha" && cmd.Name() != "eval") || len(args) < 4 {
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return err // go-redis sends it again with EVAL
		}
		key, _ := args[3].(string)
		h.mu.Lock()
		h.n[key]++
		n := h.n[key]
		h.mu.Unlock()
		h.after(key, n)
		return err
	}
}
func (h *scriptsPerKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestClusterWaitersWokenPerMaster(t *testing.T) {
	t.Parallel()
	const masters, perMaster = 3, 2
	cl := startCluster(t, masters)
	ctx := context.Background()
	admin := cl.client(t)
	p := redistest.Prefix(t, admin)

	keys := keysOnEveryMaster(p, masters, perMaster)

	gates := map[string]chan struct{}{}
	for _, k := range keys {
		gates[k] = make(chan struct{})
	}
	var wg sync.WaitGroup
	var once sync.Once
	open := func() {
		once.Do(func() {
			for _, g := range gates {
				close(g)
			}
		})
	}
	defer wg.Wait()
	defer open()
	// Without near caches: the test counts the notifier's subscribed
	// connections (a near cache holds one more per master).
	holder := cache.New[string](cl.client(t), cache.WithPrefix(p), cache.WithRetry(0, 0), cache.WithoutNearCache())
	t.Cleanup(func() { _ = holder.Close() })

	const backoff = 5 * time.Second
	var woken atomic.Int64
	wrdb := cl.client(t)
	second := make(chan string, len(keys))
	hook := &scriptsPerKey{n: map[string]int{}, after: func(key string, n int) {
		if n == 2 { // subscribed, confirmed, re-read: the next wait is on the subscription
			second <- key
		}
	}}
	wrdb.AddHook(hook)
	waiter := cache.New[string](wrdb, cache.WithPrefix(p), cache.WithRetry(50, backoff), cache.WithoutNearCache(),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventWoken {
				woken.Add(1)
			}
		}))
	t.Cleanup(func() { _ = waiter.Close() })

	for _, k := range keys {
		wg.Go(func() {
			v, err := holder.GetOrLoad(ctx, k, func(context.Context) (string, error) {
				<-gates[k]
				return "v:" + k, nil
			})
			if err != nil || v != "v:"+k {
				t.Errorf("holder of %q: %q, %v", k, v, err)
			}
		})
		eventually(t, 10*time.Second, "holder of "+k+" takes the lock", func() bool {
			return admin.Exists(ctx, cache.LockKey(p+k)).Val() == 1
		})
	}

	start := time.Now()
	got := make([]string, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Go(func() {
			got[i], errs[i] = waiter.GetOrLoad(ctx, k, func(context.Context) (string, error) {
				t.Errorf("the waiter of %q loads", k)
				return "", nil
			})
		})
	}
	for range keys {
		select {
		case <-second:
		case <-time.After(backoff / 2):
			t.Fatal("waiters did not subscribe and re-read in time")
		}
	}
	pubsubs := make([]int, masters)
	for m := range masters {
		list, err := cl.rdbs[m].Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
		if err != nil {
			t.Fatalf("CLIENT LIST: %v", err)
		}
		pubsubs[m] = strings.Count(list, "\n")
	}
	open()
	wg.Wait()
	took := time.Since(start)

	for i, k := range keys {
		if errs[i] != nil || got[i] != "v:"+k {
			t.Errorf("waiter of %q: %q, %v", k, got[i], errs[i])
		}
		hook.mu.Lock()
		n := hook.n[p+k]
		hook.mu.Unlock()
		if n != 3 {
			t.Errorf("read-or-lock calls for %q = %d; want 3 (held, re-read after subscribing, after the wake)", k, n)
		}
	}
	if n := woken.Load(); n != int64(len(keys)) {
		t.Errorf("EventWoken = %d; want %d, one per key", n, len(keys))
	}
	for m, n := range pubsubs {
		if n != 1 {
			t.Errorf("pub/sub connections on master %d = %d; want 1 (%v)", m, n, pubsubs)
		}
	}
	if took >= backoff*4/5 {
		t.Errorf("waiters took %v; a poll takes %v", took, backoff)
	}
	t.Logf("figures: 3-master cluster, %d keys (%d per master), 1 waiter each: EventWoken=%d, pub/sub connections per master %v, %v",
		len(keys), perMaster, woken.Load(), pubsubs, took.Round(time.Millisecond))
}
