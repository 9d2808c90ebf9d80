// This file checks that invalid options fail loudly at New, naming the
// option.

package cache

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

func TestNewPanicsOnInvalidOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"}) // never dialled
	t.Cleanup(func() { rdb.Close() })
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithTTL(0), "WithTTL(0s)"},
		{WithTTL(-time.Second), "WithTTL(-1s)"},
		{WithTTL(time.Microsecond), "millisecond resolution"},
		{WithNotFoundTTL(-time.Second), "WithNotFoundTTL(-1s)"},
		{WithNotFoundTTL(time.Microsecond), "millisecond resolution"},
		{WithLockTTL(0), "WithLockTTL(0s)"},
		{WithLockTTL(time.Millisecond), "at least 3ms"},
		{WithRetry(-1, time.Millisecond), "maxRetries must not be negative"},
		{WithRetry(3, 0), "backoff must be positive"},
		{WithJitter(-0.1), "WithJitter(-0.1)"},
		{WithJitter(1), "WithJitter(1)"},
		{WithLoadTimeout(0), "WithLoadTimeout(0s)"},
		{WithCodec(nil), "WithCodec(nil)"},
		{WithFailurePolicy(7), "unknown policy"},
		{WithCircuitBreaker(-1, time.Second), "WithCircuitBreaker(-1, 1s)"},
		{WithCircuitBreaker(3, 0), "WithCircuitBreaker(3, 0s)"},
		{func(c *config) { WithPrefix("a{}b:")(c); WithTags()(c) }, `WithTags with WithPrefix("a{}b:")`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			defer func() {
				r := recover()
				err, ok := r.(error)
				if !ok {
					t.Fatalf("New with %s did not panic with an error (got %v)", tc.want, r)
				}
				assert.Contains(t, err.Error(), tc.want)
			}()
			New[int](rdb, tc.opt)
		})
	}
	assert.PanicsWithValue(t, "cache: New: nil Redis client", func() { New[int](nil) })
	assert.NotPanics(t, func() { New[int](rdb, WithRetry(0, 0), WithNotFoundTTL(0), WithoutJitter()) })
}

// TestDefaultWaiterBudgetCoversTheLoadTimeout: the default budget (60 x
// 100ms = 6s) used to be shorter than the load timeout (30s), so a waiter
// gave up while the holder was still legitimately loading.
func TestDefaultWaiterBudgetCoversTheLoadTimeout(t *testing.T) {
	for _, lt := range []time.Duration{DefaultLoadTimeout, 2 * time.Second, 150 * time.Millisecond, time.Hour} {
		cfg := newConfig([]Option{WithLoadTimeout(lt)})
		if got := time.Duration(cfg.retry.max) * cfg.retry.backoff; got < lt {
			t.Errorf("WithLoadTimeout(%v): waiters give up after %v; want at least the load timeout", lt, got)
		}
	}
	cfg := newConfig([]Option{WithRetry(3, time.Millisecond), WithLoadTimeout(time.Hour)})
	assert.Equal(t, retryPolicy{max: 3, backoff: time.Millisecond}, cfg.retry, "an explicit WithRetry is kept as given")
}
