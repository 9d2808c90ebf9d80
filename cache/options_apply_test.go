// options_apply_test.go tests options that used to apply halfway (issue
// 28.7): a per-call TTL through refreshes, and replica reads with the near
// cache.

package cache

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplicaReadsOnAClusterRunNoNearCache: with WithReplicaReads on a
// cluster a near cache can keep nothing (a replica's copy may be older than
// the invalidations), yet it used to hold a lease that every writer of the
// prefix waited for, and a tracking connection per master. The Cache now
// runs as one made WithoutNearCache: no lease, and its writes still
// confirmed with the others' near caches.
func TestReplicaReadsOnAClusterRunNoNearCache(t *testing.T) {
	rdb, p := setup(t)
	addr := rdb.Options().Addr
	cluster := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:         []string{addr},
		RouteRandomly: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { // the test Redis serves every slot
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		},
	})
	t.Cleanup(func() { cluster.Close() })
	c := New[product](cluster, WithPrefix(p), WithReplicaReads())
	defer c.Close()

	src := &counter{}
	for range 5 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	require.NoError(t, c.Set(t.Context(), "k", product{ID: "p2"}))
	assert.True(t, c.near == nil, "a near cache that can keep nothing")
	assert.NotNil(t, c.writeTracker(), "its writes are not confirmed with the others' near caches")
	holders, err := rdb.HKeys(t.Context(), c.registry).Result()
	require.NoError(t, err)
	for _, h := range holders {
		assert.Equal(t, "~since", h, "a lease in the registry, which writers wait for")
	}
	assert.Zero(t, c.Stats().NearHits)
}
