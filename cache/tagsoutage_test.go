package cache

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTagsOutageKeepsOffRedis: with tags, once the breaker is open, a
// GetOrLoad costs no dial (the tag clock's read goes through the breaker
// too) and reaches the error hook no more: the opening was reported.
func TestTagsOutageKeepsOffRedis(t *testing.T) {
	t.Parallel()
	rdb, dials := dialCounter(t, deadAddr(t))
	var hooks, redisErrs atomic.Int64
	c := New[product](rdb, WithTags(), WithoutNearCache(), WithCircuitBreaker(2, time.Hour),
		WithErrorHook(func(string, error) { hooks.Add(1) }),
		WithObserver(func(e Event) {
			if e.Kind == EventRedisError {
				redisErrs.Add(1)
			}
		}))
	defer c.Close()
	src := &counter{}
	for i := 0; !c.Stats().BreakerOpen; i++ {
		require.Less(t, i, 10, "the breaker never opened")
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
	}
	d0, h0, e0, l0 := dials.Load(), hooks.Load(), redisErrs.Load(), src.calls.Load()
	for range 100 {
		_, err := c.GetOrLoad(t.Context(), "k", src.load, Tags("t"))
		require.NoError(t, err)
	}
	assert.Equal(t, l0+100, src.calls.Load(), "FailOpen loads each call, uncached")
	assert.Equal(t, d0, dials.Load(), "no dial while the breaker is open")
	assert.Equal(t, h0, hooks.Load(), "the error hook heard of the outage already")
	assert.Equal(t, e0, redisErrs.Load(), "no Redis call, no Redis error")
	assert.LessOrEqual(t, h0, int64(2*2), "before it opened: one report per failed call at most")

	err := c.Set(t.Context(), "k", product{ID: "1"}, Tags("t"))
	require.True(t, errors.Is(err, ErrCircuitOpen), "Set: %v", err)
	assert.Equal(t, d0, dials.Load(), "no dial for a Set either")
}
