// This file groups a cluster round by node: each command to its key's
// master, the commands of one node sent together, the nodes concurrently.
// Coalesced reads and pipelined rounds both route this way.

package redisio

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// toMasters looks up the master of each of keys on cc: to[i] is keys[i]'s,
// and found lists, in order, the indexes whose master was found; for the
// others, failed is called with the index and the error.
func toMasters(ctx context.Context, cc *redis.ClusterClient, keys []string, failed func(i int, err error)) (to []*redis.Client, found []int) {
	to = make([]*redis.Client, len(keys))
	found = make([]int, 0, len(keys))
	for i, key := range keys {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			failed(i, err)
			continue
		}
		to[i] = node
		found = append(found, i)
	}
	return to, found
}

// sendPerNode calls send once for each node that to names for the indexes
// in pending, with those indexes in pending's order; the nodes concurrently.
// It returns when every send has.
func sendPerNode(pending []int, to []*redis.Client, send func(node *redis.Client, idx []int)) {
	byNode := map[*redis.Client][]int{}
	for _, i := range pending {
		byNode[to[i]] = append(byNode[to[i]], i)
	}
	var wg sync.WaitGroup
	for node, idx := range byNode {
		wg.Go(func() { send(node, idx) })
	}
	wg.Wait()
}
