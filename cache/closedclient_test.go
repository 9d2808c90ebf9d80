package cache

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClosedClientIsAProgrammingError: a go-redis client closed by mistake
// is returned as such under every policy, never loaded around, never
// logged as an outage nor counted by the breaker.
func TestClosedClientIsAProgrammingError(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		for _, near := range []bool{false, true} {
			name := map[FailurePolicy]string{FailOpen: "fail open", FailClosed: "fail closed"}[policy]
			if near {
				name += ", near cache"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				rdb := redistest.Client(t, redistest.Addr(t))
				p := redistest.Prefix(t, rdb)
				logs := &logCapture{}
				var hooks, opened atomic.Int64
				opts := []Option{WithPrefix(p), WithTags(), WithFailurePolicy(policy), WithCircuitBreaker(2, DefaultBreakerCoolDown),
					WithLogger(slog.New(logs)), WithErrorHook(func(string, error) { hooks.Add(1) }),
					WithObserver(func(e Event) {
						if e.Kind == EventBreakerOpen {
							opened.Add(1)
						}
					})}
				if !near {
					opts = append(opts, WithoutNearCache())
				}
				c := New[product](rdb, opts...)
				defer c.Close()
				require.NoError(t, rdb.Close())
				src := &counter{}
				for range 20 {
					_, err := c.GetOrLoad(t.Context(), "k", src.load)
					require.True(t, errors.Is(err, redis.ErrClosed), "GetOrLoad: %v", err)
				}
				_, err := c.GetOrLoadMany(t.Context(), []string{"a", "b"}, (&source{}).loadMany)
				assert.True(t, errors.Is(err, redis.ErrClosed), "GetOrLoadMany: %v", err)
				assert.True(t, errors.Is(c.Set(t.Context(), "k", product{}), redis.ErrClosed))
				assert.True(t, errors.Is(c.Delete(t.Context(), "k"), redis.ErrClosed))
				assert.True(t, errors.Is(c.DeleteByTag(t.Context(), "t"), redis.ErrClosed))
				_, err = c.Get(t.Context(), "k")
				assert.True(t, errors.Is(err, redis.ErrClosed), "Get: %v", err)

				assert.Zero(t, src.calls.Load(), "nothing loaded around a closed client")
				assert.Zero(t, opened.Load(), "the breaker does not count a closed client")
				assert.False(t, c.Stats().BreakerOpen)
				assert.Zero(t, hooks.Load(), "returned, not absorbed")
				for _, l := range logs.lines(slog.LevelError) {
					assert.NotContains(t, l, "unreachable")
				}
			})
		}
	}
}
