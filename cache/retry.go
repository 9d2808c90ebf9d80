// This file is the waiter's retry policy: how many more lock attempts, and the
// context-aware sleep between them.

package cache

import (
	"context"
	"time"

	"github.com/stampede-go/stampede/internal/clock"
)

// retryPolicy holds no state shared between calls; each wait counts its own
// attempts, so one Cache is safe to use from many goroutines.
type retryPolicy struct {
	max     int           // attempts after the first
	backoff time.Duration // sleep before each retry
}

// wait sleeps before retry number attempt (1-based). It reports false when
// the budget is spent or ctx ends first.
func (r retryPolicy) wait(ctx context.Context, attempt int) bool {
	if attempt > r.max {
		return false
	}
	return clock.Sleep(ctx, r.backoff)
}
