// This file checks that Clear reaches near caches: its own process's,
// through the version key it writes, and another process's, through the
// invalidation Redis sends for that key.

package cache

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nearServed waits until c serves key from memory with price.
func nearServed(t *testing.T, c *Cache[product], hits *atomic.Int64, key string, price int, src *tagSource) {
	t.Helper()
	before := hits.Load()
	waitFor(t, func() bool {
		v, err := c.GetOrLoad(context.Background(), key, src.loader(key))
		return err == nil && v.Price == price && hits.Load() > before
	})
}

// countNearHits is an observer that counts near hits.
func countNearHits(n *atomic.Int64) Option {
	return WithObserver(func(e Event) {
		if e.Kind == EventNearHit {
			n.Add(1)
		}
	})
}

// One process: a value served from memory, untagged, is not served after
// Clear returned. Clear writes only its version key: the near cache must
// take that key for one every value depends on.
func TestClearEmptiesItsOwnNearCache(t *testing.T) {
	rdb, p := setup(t)
	ctx := context.Background()
	var hits atomic.Int64
	c := New[product](rdb, WithPrefix(p), WithTags(), countNearHits(&hits))
	defer c.Close()
	var src tagSource
	for round := range 2 {
		src.set("k", round)
		nearServed(t, c, &hits, "k", round, &src)
		src.set("k", round+1)
		require.NoError(t, c.Clear(ctx))
		v, err := c.GetOrLoad(ctx, "k", src.loader("k"))
		require.NoError(t, err)
		assert.Equal(t, round+1, v.Price, "round %d: a read after Clear returned got the value from before", round)
	}
}

// Two processes (Caches on separate clients): a value the reader serves
// from memory, untagged, is not served after the writer's Clear returned,
// nor is the reader's copy of a value it loaded itself.
func TestClearEmptiesOtherNearCaches(t *testing.T) {
	addr := redistest.Addr(t)
	w := redistest.Client(t, addr)
	p := redistest.Prefix(t, w)
	ctx := context.Background()
	var hits atomic.Int64
	reader := New[product](redistest.Client(t, addr), WithPrefix(p), WithTags(), countNearHits(&hits))
	defer reader.Close()
	writer := New[product](w, WithPrefix(p), WithTags())
	defer writer.Close()
	var src tagSource
	for round := range 2 {
		src.set("set", round)
		src.set("loaded", round)
		require.NoError(t, writer.Set(ctx, "set", product{ID: "set", Price: round}))
		nearServed(t, reader, &hits, "set", round, &src)
		nearServed(t, reader, &hits, "loaded", round, &src)
		src.set("set", round+1)
		src.set("loaded", round+1)
		require.NoError(t, writer.Clear(ctx))
		for _, key := range []string{"set", "loaded"} {
			v, err := reader.GetOrLoad(ctx, key, src.loader(key))
			require.NoError(t, err)
			assert.Equal(t, round+1, v.Price, "round %d: %s: a read after Clear returned elsewhere got the value from before", round, key)
		}
	}
}
