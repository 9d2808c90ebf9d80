package clock

import (
	"context"
	"time"
)

// Ended reports whether ctx has ended, or is about to: a connection
// deadline taken from ctx (ContextTimeoutEnabled) can fire a moment before
// ctx's own timer, and then the call's error is only an i/o timeout. It
// waits for that moment, so that ctx.Err() is set when it returns true.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		<-ctx.Done()
		return true
	}
	return false
}

// Sleep waits d or until ctx ends; it reports whether ctx is still alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
