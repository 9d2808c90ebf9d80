package cache

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErrorHooksChain: every hook given hears every absorbed error, in the
// order given, as observers do.
func TestErrorHooksChain(t *testing.T) {
	t.Parallel()
	rdb, _ := dialCounter(t, deadAddr(t))
	var order []int
	var first, second atomic.Int64
	c := New[product](rdb, WithoutNearCache(), WithCircuitBreaker(0, time.Second),
		WithErrorHook(func(string, error) { first.Add(1); order = append(order, 1) }),
		WithErrorHook(nil), // ignored, as WithObserver(nil)
		WithErrorHook(func(string, error) { second.Add(1); order = append(order, 2) }))
	defer c.Close()
	_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load) // FailOpen: the outage goes to the hooks
	require.NoError(t, err)
	assert.Positive(t, first.Load())
	assert.Equal(t, first.Load(), second.Load(), "each hook hears each error")
	assert.Equal(t, []int{1, 2}, order[:2])
}

// TestStatsCountDecodeErrors: a record another value type wrote is counted
// in Stats, each read that met it.
func TestStatsCountDecodeErrors(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	words := New[string](rdb, WithoutNearCache())
	defer words.Close()
	require.NoError(t, words.Set(t.Context(), key, "not a product"))
	products := New[product](rdb, WithoutNearCache())
	defer products.Close()
	_, err := products.Get(t.Context(), key)
	require.ErrorIs(t, err, ErrCacheMiss)
	assert.Equal(t, int64(1), products.Stats().DecodeErrors)
	assert.Zero(t, words.Stats().DecodeErrors)
}
