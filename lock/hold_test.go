// This file proves Lock.Hold and Do: the lease is renewed while the work
// runs, and the work's context is cancelled at once when the lease is lost.

package lock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refreshFault acts on the lock's refresh script calls only: it fails the
// next fails of them with errFault, and while stall is set it blocks them
// until unstall is closed (a Redis that stopped answering, with a client
// that does not enforce context deadlines on reads).
type refreshFault struct {
	fails   atomic.Int64
	failed  atomic.Int64
	calls   atomic.Int64
	stall   atomic.Bool
	unstall chan struct{}
}

var errFault = errors.New("injected refresh failure")

func newRefreshFault(t *testing.T) *refreshFault {
	f := &refreshFault{unstall: make(chan struct{})}
	t.Cleanup(func() { close(f.unstall) })
	return f
}

func isRefresh(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	switch cmd.Name() {
	case "evalsha":
		return args[1] == lockRefreshScript.Hash()
	case "eval":
		return args[1] == lockRefreshLua
	}
	return false
}

func (f *refreshFault) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *refreshFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isRefresh(cmd) {
			return next(ctx, cmd)
		}
		f.calls.Add(1)
		if f.fails.Add(-1) >= 0 {
			f.failed.Add(1)
			cmd.SetErr(errFault)
			return errFault
		}
		if f.stall.Load() {
			<-f.unstall
		}
		return next(ctx, cmd)
	}
}
func (f *refreshFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// faulty returns a client whose lock refreshes f controls.
func faulty(t *testing.T, f *refreshFault) *redis.Client {
	rdb := redistest.Client(t, redistest.Addr(t))
	rdb.AddHook(f)
	return rdb
}

// waitOrGiveUp is work that runs until its context ends or d passes; it
// reports which through cancelled.
func waitOrGiveUp(d time.Duration, cancelled *atomic.Bool) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			cancelled.Store(true)
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
}

func TestHoldRenewsLease(t *testing.T) {
	rdb, p := setup(t)
	f := newRefreshFault(t)
	const ttl = 300 * time.Millisecond // refreshed every 100ms: a late refresh under -race on 2 busy cores stays well inside it
	l, err := Obtain(t.Context(), faulty(t, f), p+"k", ttl)
	require.NoError(t, err)

	var cancelled atomic.Bool
	others := 0
	err = l.Hold(t.Context(), func(ctx context.Context) error {
		for range 10 { // 10 x 150ms = 5 leases
			time.Sleep(ttl / 2)
			if _, err := Obtain(t.Context(), rdb, p+"k", ttl); err == nil {
				others++
			}
		}
		cancelled.Store(ctx.Err() != nil)
		return nil
	})
	require.NoError(t, err)
	assert.False(t, cancelled.Load(), "a renewed lease must not cancel the work")
	assert.Zero(t, others, "nobody else may take the lock while it is held")
	assert.GreaterOrEqual(t, f.calls.Load(), int64(5), "the lease must be renewed about every ttl/3")
	assert.Equal(t, l.Token(), rdb.Get(t.Context(), p+"k").Val(), "Hold must not release the lock")
}

func TestHoldCancelsAtOnceWhenLockTaken(t *testing.T) {
	rdb, p := setup(t)
	const ttl = 3 * time.Second // the first refresh comes after 1s
	l, err := Obtain(t.Context(), rdb, p+"k", ttl)
	require.NoError(t, err)

	var cause error
	var cancelled atomic.Bool
	start := time.Now()
	err = l.Hold(t.Context(), func(ctx context.Context) error {
		// Another process takes the key (an operator deleted it, say).
		require.NoError(t, rdb.Set(t.Context(), p+"k", "someone-else", time.Minute).Err())
		err := waitOrGiveUp(5*time.Second, &cancelled)(ctx)
		cause = context.Cause(ctx)
		return err
	})
	assert.True(t, cancelled.Load(), "the work must be cancelled when a refresh finds the lock taken")
	assert.Less(t, time.Since(start), ttl-500*time.Millisecond, "cancelled at the refresh that found the lock taken, not at the end of the lease")
	assert.ErrorIs(t, cause, ErrLost, "context.Cause must say why")
	assert.ErrorIs(t, err, ErrLost)
	assert.ErrorIs(t, err, context.Canceled, "fn's own error comes back too")
	assert.Zero(t, l.Validity())
}

// TestHoldCancelsWhenStalledRedisOutlivesLease: the refresh calls hang
// (a stopped Redis, a client without ContextTimeoutEnabled). The work must
// be cancelled when the lease can no longer be assumed valid, not when the
// hung call returns.
func TestHoldCancelsWhenStalledRedisOutlivesLease(t *testing.T) {
	_, p := setup(t)
	f := newRefreshFault(t)
	f.stall.Store(true)
	const ttl = 300 * time.Millisecond
	start := time.Now()
	l, err := Obtain(t.Context(), faulty(t, f), p+"k", ttl)
	require.NoError(t, err)

	var cancelled atomic.Bool
	var at time.Duration
	err = l.Hold(t.Context(), func(ctx context.Context) error {
		err := waitOrGiveUp(10*time.Second, &cancelled)(ctx)
		at = time.Since(start)
		return err
	})
	require.True(t, cancelled.Load(), "the work must be cancelled while the refresh still hangs")
	assert.ErrorIs(t, err, ErrLost)
	assert.GreaterOrEqual(t, at, ttl-clockDrift(ttl)-5*time.Millisecond, "cancelled before the lease ran out")
	assert.Less(t, at, ttl+time.Second, "cancelled long after the lease ran out (loose bound)")
	assert.Equal(t, int64(1), f.calls.Load(), "one refresh, still hanging")
}

// TestHoldSurvivesTransientRefreshErrors carries over redislock's "refresh
// retry transient error": failed refreshes are retried while the lease lasts.
func TestHoldSurvivesTransientRefreshErrors(t *testing.T) {
	rdb, p := setup(t)
	f := newRefreshFault(t)
	f.fails.Store(2)
	const ttl = 600 * time.Millisecond // the lease must outlast a late refresh under -race on busy cores
	l, err := Obtain(t.Context(), faulty(t, f), p+"k", ttl)
	require.NoError(t, err)

	var cancelled atomic.Bool
	err = l.Hold(t.Context(), waitOrGiveUp(3*ttl, &cancelled))
	require.NoError(t, err)
	assert.False(t, cancelled.Load(), "two failed refreshes within the lease must not cancel the work")
	assert.Equal(t, int64(2), f.failed.Load(), "both injected failures must have been met")
	assert.Equal(t, l.Token(), rdb.Get(t.Context(), p+"k").Val())
}

// TestHoldRefreshErrorsUntilLeaseEnds carries over redislock's "refresh
// retry transient error exhausted": when every refresh fails, the work is
// cancelled at the end of the lease, not at the first error.
func TestHoldRefreshErrorsUntilLeaseEnds(t *testing.T) {
	_, p := setup(t)
	f := newRefreshFault(t)
	f.fails.Store(1 << 30)
	const ttl = 300 * time.Millisecond
	start := time.Now()
	l, err := Obtain(t.Context(), faulty(t, f), p+"k", ttl)
	require.NoError(t, err)

	var cancelled atomic.Bool
	var at time.Duration
	err = l.Hold(t.Context(), func(ctx context.Context) error {
		err := waitOrGiveUp(10*time.Second, &cancelled)(ctx)
		at = time.Since(start)
		return err
	})
	require.True(t, cancelled.Load())
	assert.ErrorIs(t, err, ErrLost)
	assert.GreaterOrEqual(t, at, ttl-clockDrift(ttl)-5*time.Millisecond, "a Redis error is not a lost lock while the lease lasts")
	assert.Less(t, at, ttl+time.Second)
	assert.GreaterOrEqual(t, f.failed.Load(), int64(2), "failed refreshes are retried")
}

func TestHoldParentCancelled(t *testing.T) {
	rdb, p := setup(t)
	l, err := Obtain(t.Context(), rdb, p+"k", time.Minute)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var cancelled atomic.Bool
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	err = l.Hold(ctx, waitOrGiveUp(5*time.Second, &cancelled))
	assert.True(t, cancelled.Load())
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrLost, "the caller's cancel is not a lost lock")
	assert.Equal(t, l.Token(), rdb.Get(t.Context(), p+"k").Val())
}

func TestHoldNeedsAValidLease(t *testing.T) {
	rdb, p := setup(t)
	run := func(l *Lock) (bool, error) {
		called := false
		err := l.Hold(t.Context(), func(context.Context) error { called = true; return nil })
		return called, err
	}

	released, err := Obtain(t.Context(), rdb, p+"released", time.Minute)
	require.NoError(t, err)
	require.NoError(t, released.Release(t.Context()))
	called, err := run(released)
	assert.ErrorIs(t, err, ErrNotHeld)
	assert.False(t, called, "Hold must not run fn on a released lock")

	expired, err := Obtain(t.Context(), rdb, p+"expired", 20*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond)
	called, err = run(expired)
	assert.ErrorIs(t, err, ErrNotHeld)
	assert.False(t, called, "Hold must not run fn once the lease has run out")
}

func TestHoldPanicStopsWatchdog(t *testing.T) {
	_, p := setup(t)
	f := newRefreshFault(t)
	// A lease long enough that a slow dial under -race does not end it before
	// Hold starts; the sleep then spans three of its refresh ticks.
	const ttl = 300 * time.Millisecond
	l, err := Obtain(t.Context(), faulty(t, f), p+"k", ttl)
	require.NoError(t, err)
	assert.PanicsWithValue(t, "boom", func() {
		_ = l.Hold(t.Context(), func(context.Context) error { panic("boom") })
	})
	n := f.calls.Load()
	time.Sleep(ttl)
	assert.Equal(t, n, f.calls.Load(), "no refresh after Hold returned")
}

func TestDo(t *testing.T) {
	rdb, p := setup(t)
	key := p + "sync:customer:42"
	var runs, skips atomic.Int64
	work := func(ctx context.Context) error {
		runs.Add(1)
		// A second instance arrives while the first works.
		err := Do(ctx, rdb, key, time.Minute, func(context.Context) error { runs.Add(1); return nil })
		if errors.Is(err, ErrNotObtained) {
			skips.Add(1)
		}
		return nil
	}
	require.NoError(t, Do(t.Context(), rdb, key, time.Minute, work))
	assert.Equal(t, int64(1), runs.Load(), "the second instance must skip")
	assert.Equal(t, int64(1), skips.Load())
	assert.Zero(t, rdb.Exists(t.Context(), key).Val(), "Do releases the lock")

	boom := errors.New("boom")
	err := Do(t.Context(), rdb, key, time.Minute, func(context.Context) error { return boom })
	assert.ErrorIs(t, err, boom, "fn's error comes back")
	assert.Zero(t, rdb.Exists(t.Context(), key).Val(), "Do releases the lock after an error too")

	assert.Error(t, Do(t.Context(), rdb, key, time.Minute, nil))
	assert.Error(t, Do(t.Context(), rdb, key, 0, work), "Obtain's checks apply")
}
