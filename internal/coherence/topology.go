// topology.go keeps one tracking connection per master (per shard on a Ring).

package coherence

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// watch keeps a node per master until ctx ends (Close).
func (t *Tracker) watch(ctx context.Context) {
	defer t.done.Done()
	tick := time.NewTicker(checkEvery)
	defer tick.Stop()
	for {
		t.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sync makes the tracked nodes the current masters; a change drops memory.
func (t *Tracker) sync(ctx context.Context) {
	want, err := t.masters(ctx)
	if err != nil {
		if t.ready.Load() {
			t.dropAll(true)
		}
		return
	}
	t.mu.Lock()
	changed := len(want) != len(t.nodes)
	for addr := range want {
		if _, ok := t.nodes[addr]; !ok {
			changed = true
		}
	}
	t.mu.Unlock()
	if changed {
		// Before the count of connections changes: a marker counted against
		// the old set is then acknowledged with memory already empty.
		t.dropAll(true)
	}
	t.mu.Lock()
	for addr, opt := range want {
		if _, ok := t.nodes[addr]; !ok {
			t.nodes[addr] = t.startNode(ctx, addr, opt)
		}
	}
	for addr, n := range t.nodes {
		if _, ok := want[addr]; !ok {
			delete(t.nodes, addr)
			t.stopNode(n)
		}
	}
	t.nnodes.Store(int32(len(t.nodes)))
	t.mu.Unlock()
	if changed {
		t.dropAll(true)
	}
	t.settle()
}

// settle makes the tracker sure once every node is subscribed.
func (t *Tracker) settle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := len(t.nodes) > 0
	for _, n := range t.nodes {
		all = all && n.subbed.Load()
	}
	if all && !t.ready.Load() {
		t.ready.Store(true)
		select { // serve only once the lease is renewed over these connections
		case t.renewNow <- struct{}{}:
		default:
		}
	}
}

// masters lists the nodes that hold the cache's keys, with their options.
func (t *Tracker) masters(ctx context.Context) (map[string]*redis.Options, error) {
	out := map[string]*redis.Options{}
	var mu sync.Mutex
	add := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		out[c.Options().Addr] = c.Options()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, checkEvery)
	defer cancel()
	switch r := t.rdb.(type) {
	case *redis.ClusterClient:
		r.ReloadState(ctx) // in the background: the next check sees a new topology
		return out, r.ForEachMaster(ctx, add)
	case *redis.Ring:
		return out, r.ForEachShard(ctx, add)
	case *redis.Client:
		return out, add(ctx, r)
	}
	return nil, errors.New("cache: near cache: unsupported Redis client type")
}
