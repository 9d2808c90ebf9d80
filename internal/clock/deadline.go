package clock

import (
	"context"
	"sync/atomic"
	"time"
)

// Shared hands flights a context that ends between 3/4 of the timeout and
// the timeout after they start, renewed every quarter timeout: one timer
// per quarter instead of one per flight. (go-redis's own timeouts do not
// bound everything: a new connection's handshake can wait on the context
// alone.) The zero value is ready; it is safe for concurrent use.
type Shared struct{ cur atomic.Pointer[deadlineCtx] }

type deadlineCtx struct {
	context.Context
	cancel  context.CancelFunc // never called: the context ends at its deadline
	renewAt int64              // Now after which flights get a newer one
}

// Within returns a context with ctx's values, without its cancellation,
// that ends within timeout of at.
func (d *Shared) Within(ctx context.Context, timeout time.Duration, at time.Time) context.Context {
	now := At(at)
	cur := d.cur.Load()
	if cur == nil || now >= cur.renewAt {
		next := &deadlineCtx{renewAt: now + int64(timeout/4)}
		next.Context, next.cancel = context.WithTimeout(context.Background(), timeout)
		if !d.cur.CompareAndSwap(cur, next) {
			next = d.cur.Load()
		}
		cur = next
	}
	if ctx == context.Background() || ctx == context.TODO() {
		return cur.Context
	}
	return valuesOf{cur.Context, ctx}
}

// valuesOf is a deadline context with another context's values.
type valuesOf struct {
	context.Context
	values context.Context
}

func (v valuesOf) Value(key any) any { return v.values.Value(key) }
