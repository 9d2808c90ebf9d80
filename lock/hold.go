// This file runs work while holding a lock: a watchdog renews the lease, and
// the work's context is cancelled at once when the lease is lost.

package lock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrLost is the cause of the context that [Lock.Hold] gives its
// function when the lease was lost while the function ran, and is part of
// Hold's error then. Match it with errors.Is, and read it from the function's
// context with context.Cause.
var ErrLost = errors.New("lock: lock lost")

// Hold runs fn while renewing the lock's lease, and returns fn's error.
//
// A watchdog refreshes the lease to its ttl (the one given to Obtain, or to
// the last [Lock.Refresh]) every ttl/3 while fn runs; a refresh that fails
// with a Redis error is retried every ttl/10. fn's context, derived from ctx,
// is cancelled with the cause [ErrLost] at once when the lease is lost:
// when a refresh finds the lock no longer ours, or when refreshes have failed
// until the lease can no longer be assumed valid (see [Lock.Validity]: the
// last granted lease minus the clock drift margin), even while a refresh
// call to a stalled Redis is still waiting for its reply. Hold then returns
// errors.Join(ErrLost, fn's error) once fn returns. fn must watch its
// context: Hold cannot stop work that ignores it, and another process may
// take the lock as soon as the lease has run out.
//
// Hold neither obtains nor releases the lock: when fn returns the lease runs
// on for up to ttl. Release it (or use [Do]) when others may start at once;
// keep it when the lease itself should keep others out, as for one run of a
// scheduled job. On a nil Lock, or one whose lease can no longer be assumed
// valid when Hold is called (see [Lock.Validity]: released, found lost, or
// run out), Hold returns [ErrNotHeld] without calling fn. A panic in fn
// stops the watchdog and propagates.
//
// The watchdog is a goroutine that ends before Hold returns; a refresh call
// still waiting for a stalled Redis then is left to end with the client's
// timeouts, bounded by the lease. Hold may be called again after it returns;
// calling it concurrently on one Lock is safe but refreshes twice as often.
func (l *Lock) Hold(ctx context.Context, fn func(ctx context.Context) error) error {
	if l == nil {
		return ErrNotHeld
	}
	if fn == nil {
		return errors.New("lock: Hold: nil fn")
	}
	if l.Validity() == 0 {
		return ErrNotHeld // released, found lost, or its lease has run out
	}
	work, cancel := context.WithCancelCause(context.WithValue(ctx, heldKey{}, l))
	defer cancel(nil)
	lost := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l.watch(ctx, stop) {
			close(lost)
			cancel(ErrLost)
			l.lost(EventLost, ErrLost) // unless the renewal that found it lost said so
		}
	}()
	err := func() error {
		defer func() { close(stop); <-done }()
		return fn(work)
	}()
	if isClosed(lost) {
		return errors.Join(ErrLost, err)
	}
	return err
}

// heldKey is the context key under which Hold puts its Lock for fn.
type heldKey struct{}

// FromContext returns the Lock that [Lock.Hold], and so [Do], runs the
// function under, from that function's context (the innermost one when
// Holds nest), or nil for any other context; a nil Lock is safe to use
// (its Fence is 0). It lets a function run by Do send its fencing token to
// the store:
//
//	err := lock.Do(ctx, rdb, "stock:"+sku, 5*time.Second, func(ctx context.Context) error {
//		return store.SetQty(ctx, sku, qty, lock.FromContext(ctx).Fence())
//	})
func FromContext(ctx context.Context) *Lock {
	l, _ := ctx.Value(heldKey{}).(*Lock)
	return l
}

// watch renews the lease until stop is closed (it returns false) or the
// lease is lost (true).
func (l *Lock) watch(ctx context.Context, stop <-chan struct{}) bool {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	expiry := time.NewTimer(time.Until(l.validity()))
	defer expiry.Stop()
	tick := time.NewTimer(every(l.lease(), 3))
	defer tick.Stop()
	var refreshed chan error // nil while no refresh is under way
	for {
		select {
		case <-stop:
			return false
		case <-expiry.C:
			return true
		case <-tick.C:
			refreshed = make(chan error, 1) // the refresh never blocks on it
			rctx, rcancel := context.WithDeadline(wctx, l.validity())
			go func(ch chan<- error) {
				defer rcancel()
				ch <- l.Refresh(rctx, l.lease())
			}(refreshed)
		case err := <-refreshed:
			refreshed = nil
			switch {
			case err == nil:
				expiry.Reset(time.Until(l.validity()))
				tick.Reset(every(l.lease(), 3))
			case errors.Is(err, ErrNotHeld):
				return true
			default: // a Redis error: try again soon, while the lease lasts
				tick.Reset(every(l.lease(), 10))
			}
		}
	}
}

// every is ttl/n, at least 1ms.
func every(ttl time.Duration, n int) time.Duration {
	return max(ttl/time.Duration(n), time.Millisecond)
}

// Do runs fn while holding the lock at key: it obtains the lock as [Obtain]
// does (with the same options, ttl and errors: when another process holds
// it, Do returns [ErrNotObtained] without calling fn), runs fn under
// [Lock.Hold], and then releases the lock. It returns fn's error, joined with
// [ErrLost] if the lease was lost while fn ran, and with the release's
// error if that failed. This is the shape of a worker that should run on
// one instance at a time, the others skipping:
//
//	err := lock.Do(ctx, rdb, "sync:customer:"+id, 15*time.Second, syncCustomer)
//	if errors.Is(err, lock.ErrNotObtained) { /* another instance has it */ }
//
// The release runs even when ctx has ended, bounded by ttl.
func Do(ctx context.Context, rdb redis.Scripter, key string, ttl time.Duration, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return errors.New("lock: Do: nil fn")
	}
	l, err := Obtain(ctx, rdb, key, ttl, opts...)
	if err != nil {
		return err
	}
	err = l.Hold(ctx, fn)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
	defer cancel()
	if rerr := l.Release(rctx); rerr != nil && !errors.Is(err, ErrLost) {
		err = errors.Join(err, rerr)
	}
	return err
}
