// This file proves the lock's retry strategies: their waits, their
// limits, and that one strategy shared by many calls shares no state.

package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waits returns the first n waits of s (fewer if it stops).
func waits(s RetryStrategy, n int) []time.Duration {
	var got []time.Duration
	for d := range s.Backoffs() {
		if len(got) == n {
			break
		}
		got = append(got, d)
	}
	return got
}

func TestRetryStrategies(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    RetryStrategy
		want []time.Duration
	}{
		{"no retry", NoRetry(), nil},
		{"zero value", RetryStrategy{}, nil},
		{"linear", LinearBackoff(time.Second), []time.Duration{time.Second, time.Second, time.Second, time.Second}},
		{"limit", LimitRetry(LinearBackoff(time.Second), 2), []time.Duration{time.Second, time.Second}},
		{"limit zero", LimitRetry(LinearBackoff(time.Second), 0), nil},
		{"limit of none", LimitRetry(NoRetry(), 5), nil},
		{"func", RetryFunc(func(n int) (time.Duration, bool) { return time.Duration(n) * time.Millisecond, n <= 3 }),
			[]time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := waits(tc.s, 4)
			assert.Equal(t, tc.want, got, "waits = %v; want %v", got, tc.want)
			assert.Equal(t, got, waits(tc.s, 4), "a second call must start from the beginning")
		})
	}
}

func TestExponentialBackoff(t *testing.T) {
	const lo, hi = 10 * time.Millisecond, 300 * time.Millisecond
	ceilings := []time.Duration{10, 20, 40, 80, 160, 300, 300, 300}
	s := ExponentialBackoff(lo, hi)
	distinct := map[time.Duration]bool{}
	for range 50 {
		got := waits(s, len(ceilings))
		require.Len(t, got, len(ceilings))
		for i, d := range got {
			b := ceilings[i] * time.Millisecond
			assert.True(t, d >= b/2 && d <= b, "wait %d = %v; want in [%v, %v]", i+1, d, b/2, b)
		}
		distinct[got[5]] = true
	}
	assert.Greater(t, len(distinct), 10, "the waits must be jittered")

	// Far along, the wait stays at the ceiling without overflowing.
	s = ExponentialBackoff(time.Nanosecond, time.Hour)
	for d := range LimitRetry(s, 200).Backoffs() {
		assert.True(t, d >= 0 && d <= time.Hour, "wait %v out of [0, 1h]", d)
	}
}

// TestRetryStrategyHasNoSharedState is the opposite of redislock's
// TestLimitRetry_concurrent: there, 64 goroutines sharing LimitRetry(s, 100)
// got 100 retries between them; here each call gets its own 100.
func TestRetryStrategyHasNoSharedState(t *testing.T) {
	const limit, callers = 100, 64
	s := LimitRetry(LinearBackoff(time.Millisecond), limit)
	var total atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			n := 0
			for range s.Backoffs() {
				n++
			}
			assert.Equal(t, limit, n, "each call must count its own retries")
			total.Add(int64(n))
		})
	}
	close(start)
	wg.Wait()
	assert.Equal(t, int64(limit*callers), total.Load())
}

// TestObtainFollowsStrategy counts the attempts Obtain makes and the waits it
// asks for, against a lock held by someone else.
func TestObtainFollowsStrategy(t *testing.T) {
	rdb, p := setup(t)
	_, err := Obtain(t.Context(), rdb, p+"k", time.Minute)
	require.NoError(t, err)

	var asked []int
	var mu sync.Mutex
	s := RetryFunc(func(n int) (time.Duration, bool) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, n)
		return time.Millisecond, n <= 4
	})
	counter := &redistest.Commands{Match: runsObtain}
	counted := redistest.Client(t, redistest.Addr(t))
	counted.AddHook(counter)
	_, err = Obtain(t.Context(), counted, p+"k", time.Minute, WithRetry(s))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, []int{1, 2, 3, 4, 5}, asked, "the strategy is asked before each retry, from 1")
	assert.Equal(t, 5, counter.Total(), "one attempt, then 4 retries")

	_, err = Obtain(t.Context(), rdb, p+"k", time.Minute, WithRetry(RetryFunc(func(int) (time.Duration, bool) { return -1, true })))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "negative wait")

	// The default is one attempt.
	counter.Reset()
	_, err = Obtain(t.Context(), counted, p+"k", time.Minute)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, 1, counter.Total())
}

func TestObtainRetryWaitsAreSlept(t *testing.T) {
	rdb, p := setup(t)
	_, err := Obtain(t.Context(), rdb, p+"k", time.Minute)
	require.NoError(t, err)
	start := time.Now()
	_, err = Obtain(t.Context(), rdb, p+"k", time.Minute, WithRetry(LimitRetry(LinearBackoff(30*time.Millisecond), 3)))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.GreaterOrEqual(t, time.Since(start), 90*time.Millisecond, "three waits of 30ms")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = Obtain(ctx, rdb, p+"k", time.Minute, WithRetry(LinearBackoff(time.Hour)))
	assert.ErrorIs(t, err, ErrNotObtained)
	assert.ErrorIs(t, err, context.Canceled)
}

// runsObtain matches the lock's obtain script calls.
func runsObtain(cmd redis.Cmder) bool {
	args := cmd.Args()
	return len(args) > 1 && (args[1] == lockObtainScript.Hash() || args[1] == lockObtainLua)
}
