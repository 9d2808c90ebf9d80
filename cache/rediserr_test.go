// This file proves how the cache acts on Redis errors: transient
// cluster states are waited out and misconfiguration is returned
// under every policy.

package cache

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replyError returns a real error reply with text msg, made by the server.
func replyError(t *testing.T, rdb *redis.Client, msg string) error {
	t.Helper()
	err := rdb.Eval(t.Context(), "return redis.error_reply(ARGV[1])", nil, msg).Err()
	require.Error(t, err)
	require.Equal(t, msg, err.Error())
	return err
}

// TestTransientErrorsAreWaitedOut: while a slot migrates (TRYAGAIN, on a
// cluster client: see the reliability suite's real migration) or a server
// loads its data set, the lock script fails. It used to go to the failure
// policy: every instance loaded uncached. Now the flight waits and retries,
// so the key loads once and is stored.
func TestTransientErrorsAreWaitedOut(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	hook := redistest.FailCommands(redistest.IsScript, replyError(t, rdb, "LOADING Redis is loading the dataset in memory"), 3)
	rdb.AddHook(hook)
	var reported atomic.Int64
	c := New[product](rdb, WithRetry(10, 5e6), WithErrorHook(func(string, error) { reported.Add(1) }),
		WithoutNearCache()) // it counts scripts, and adds a hook to a client in use (a race on go-redis v9.5.5)
	src := &counter{}
	v, err := c.GetOrLoad(t.Context(), p+"k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID)
	assert.Equal(t, int64(3), hook.Seen())
	assert.Equal(t, int64(1), src.calls.Load())
	assert.Equal(t, int64(1), rdb.Exists(t.Context(), p+"k").Val(), "the value must be stored once the slot settles")
	assert.Zero(t, reported.Load(), "a wait is not a failure")

	t.Run("Delete", func(t *testing.T) {
		hook := redistest.FailCommands(redistest.Named("del"), replyError(t, rdb, "MASTERDOWN Link with MASTER is down"), 2)
		rdb.AddHook(hook)
		require.NoError(t, c.Delete(t.Context(), p+"k"))
		assert.Equal(t, int64(2), hook.Seen())
		assert.Zero(t, rdb.Exists(t.Context(), p+"k").Val())
	})
}

// TestClusterRepliesToAPlainClientAreReturned: a *redis.Client on one node
// of a cluster gets MOVED for other nodes' keys for ever; waiting it out
// would only delay the error by the load timeout.
func TestClusterRepliesToAPlainClientAreReturned(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	hook := redistest.FailCommands(redistest.Named("get"), replyError(t, rdb, "MOVED 3999 127.0.0.1:6381"), 1<<30)
	rdb.AddHook(hook)
	src := &counter{}
	_, err := New[product](rdb).GetOrLoad(t.Context(), p+"k", src.load)
	require.ErrorContains(t, err, "MOVED")
	assert.Equal(t, int64(1), hook.Seen(), "returned at once, not polled")
	assert.Zero(t, src.calls.Load())
}

// TestTransientErrorsThatLastAreReturned: a transient reply that outlasts
// the budget (a client on a replica gets READONLY for ever) is returned,
// naming it, under every policy, rather than turned into uncached loads.
func TestTransientErrorsThatLastAreReturned(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		rdb, p := setup(t)
		hook := redistest.FailCommands(redistest.IsScript, replyError(t, rdb, "READONLY You can't write against a read only replica."), 1<<30)
		rdb.AddHook(hook)
		src := &counter{}
		_, err := New[product](rdb, WithFailurePolicy(policy), WithRetry(3, time.Millisecond), WithoutNearCache()).GetOrLoad(t.Context(), p+"k", src.load)
		require.ErrorContains(t, err, "READONLY")
		assert.Equal(t, int64(4), hook.Seen())
		assert.Zero(t, src.calls.Load())
	}
}

// TestMisconfigurationIsReturnedUnderEveryPolicy: a missing permission used
// to be absorbed by FailOpen (100 loads, 0 errors, nothing visible).
func TestMisconfigurationIsReturnedUnderEveryPolicy(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		for _, cmd := range []string{"get", "script"} {
			rdb, p := setup(t)
			match := redistest.Named(cmd)
			if cmd == "script" {
				match = redistest.IsScript
			}
			hook := redistest.FailCommands(match, replyError(t, rdb, "NOPERM this user has no permissions to run the '"+cmd+"' command"), 1<<30)
			rdb.AddHook(hook)
			src := &counter{}
			_, err := New[product](rdb, WithFailurePolicy(policy)).GetOrLoad(t.Context(), p+"k", src.load)
			require.Error(t, err, "policy %d, %s refused", policy, cmd)
			assert.Contains(t, err.Error(), "NOPERM")
			assert.Zero(t, src.calls.Load(), "policy %d, %s refused: the loader must not run", policy, cmd)
		}
	}
}

func TestDeleteWrapsRedisErrors(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	err := New[product](dead).Delete(t.Context(), "k")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cache: redis: ")
}

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
