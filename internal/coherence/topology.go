// This file keeps one tracking connection per master (per shard on a Ring) while a hub has trackers.

package coherence

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// watch keeps a node per master until ctx ends (Close), syncing every
// checkEvery and whenever the trackers change.
func (h *Hub) watch(ctx context.Context) {
	defer h.done.Done()
	tick := time.NewTicker(checkEvery)
	defer tick.Stop()
	for {
		h.sync(ctx)
		h.checkReaders(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-h.kick:
		}
	}
}

// sync makes the tracked nodes the current masters (none while the hub has
// no tracker); a change drops every tracker's memory.
func (h *Hub) sync(ctx context.Context) {
	want := map[string]*redis.Options{}
	if len(h.state.Load().trackers) > 0 {
		var err error
		if want, err = h.masters(ctx); err != nil {
			h.tmu.RLock()
			for _, t := range h.trackers {
				if t.ready.Load() {
					t.dropAll(true)
				}
			}
			h.tmu.RUnlock()
			return
		}
	}
	h.tmu.RLock()
	defer h.tmu.RUnlock()
	h.mu.Lock()
	changed := len(want) != len(h.nodes)
	for addr := range want {
		if _, ok := h.nodes[addr]; !ok {
			changed = true
		}
	}
	h.mu.Unlock()
	if changed {
		// Before the count of connections changes: a marker counted against
		// the old set is then acknowledged with memory already empty.
		h.dropAllLocked(true)
	}
	h.mu.Lock()
	for addr, opt := range want {
		if _, ok := h.nodes[addr]; !ok && ctx.Err() == nil {
			h.nodes[addr] = h.startNode(ctx, addr, opt)
		}
	}
	for addr, n := range h.nodes {
		if _, ok := want[addr]; !ok {
			delete(h.nodes, addr)
			h.stopNode(n)
		}
	}
	for _, t := range h.trackers {
		t.nnodes.Store(int32(len(h.nodes)))
	}
	h.mu.Unlock()
	if changed {
		h.dropAllLocked(true)
	}
	h.settle()
}

// masters lists the nodes that hold the client's keys, with their options.
func (h *Hub) masters(ctx context.Context) (map[string]*redis.Options, error) {
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
	switch r := h.rdb.(type) {
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
