// Package lock is a lock on a Redis key for work that must run in one place
// at a time across processes: one worker per customer, one run of a cron
// job, one sale of the last item. It is a lease with a fencing token, and
// Redlock over independent masters.
//
//	err := lock.Do(ctx, rdb, "sync:customer:42", 15*time.Second, func(ctx context.Context) error {
//		return syncCustomer(ctx, "42") // the lease is renewed while this runs
//	})
//	if errors.Is(err, lock.ErrNotObtained) {
//		// another instance has customer 42: skip it
//	}
//
// [Do] obtains the lock, runs the function while a watchdog renews the
// lease, cancels the function's context if the lease is lost, and releases
// the lock. (ExampleDo runs this in CI.)
//
// # The jobs
//
//   - One worker at a time, with renewal: [Do], or [Obtain] then
//     [Lock.Hold]. The others skip the work ([ErrNotObtained]), or wait
//     for it with [WithRetry].
//   - No oversell: take the lock around read-modify-write, and send
//     [Lock.Fence] with each write so that the store refuses the write of a
//     holder that stalled past its lease (ExampleLock_Fence, with the SQL).
//   - A cron run once: name the lock after the run ("report:2026-11-22")
//     and keep it until its lease ends, so that late instances skip it
//     (ExampleLock_Hold). A repeated submission refused is the same
//     pattern (ExampleObtain).
//   - An acquire timeout: [WithRetry] with [LinearBackoff],
//     [ExponentialBackoff] (bounded by [LimitRetry]) or [RetryFunc], and a
//     context deadline; the error is [ErrNotObtained] joined with
//     ctx.Err().
//   - Redlock: [ObtainQuorum] takes the lock on a majority of independent
//     masters, for a lock that survives the loss of a minority of them. It
//     has no fencing token; its doc says when to use it.
//
// A lease can be renewed by hand ([Lock.Refresh]), inspected ([Lock.TTL],
// [Lock.Validity]) and given back early ([Lock.Release]). Release and
// Refresh act only while the key holds this holder's random token: a late
// call by a holder whose lease was taken over returns [ErrNotHeld] and
// changes nothing. Every method is safe on a nil *Lock.
//
// # Metrics
//
// [WithObserver] sends the lock's events to a function of yours: each
// acquisition and give-up, with how long the call took and its attempts; a
// loss, found at a renewal or at [Lock.Release], once per acquisition; and
// the fence refusals that the application reports with
// [Lock.FenceRefused] (only the store sees them). See [Event]. The lock
// imports no metrics library: LockObserver in the module
// github.com/stampede-go/stampede/otel turns the events into
// OpenTelemetry metrics.
//
// # What it guarantees
//
// While a holder's lease runs, no other caller of [Obtain] gets the key. A
// lease is not a mutex: a holder paused past its TTL (GC, a frozen VM) can
// still act after another took over. [Lock.Hold] cancels the work's context
// when the lease can no longer be assumed valid, which narrows that window;
// only the fence, checked by the store, closes it. On a replicated Redis a
// failover can lose a lock (and the last fences) not yet copied to the
// replica.
//
// The lock key is the key given (after [WithPrefix]); its fencing counter
// lives beside it in the same cluster slot ([Lock.FenceKey]). Functions
// never panic on their input: invalid arguments and options are errors.
// Everything is safe for concurrent use. The read-through cache that loads
// a key once is package github.com/stampede-go/stampede/cache, which does
// not use this package.
package lock
