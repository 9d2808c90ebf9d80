// errors.go defines the errors the package returns and how a loader panic
// becomes one.

package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

var (
	// ErrNotFound is what a loader returns to say the value does not exist.
	// It is cached for the not-found TTL (see [WithNotFoundTTL]) and returned
	// to every caller as ErrNotFound until that record expires. Match it with
	// errors.Is.
	ErrNotFound = errors.New("cache: not found")

	// ErrLockNotAcquired is returned when a caller used its whole retry budget
	// (see [WithRetry]) without finding a value or taking the lock, because
	// another holder is still loading. When the shared load's context ended
	// the wait, it is joined with that context's error.
	ErrLockNotAcquired = errors.New("cache: lock not acquired")

	// ErrLockNotHeld is returned by [Lock.Release] and [Lock.Refresh] when the
	// lock has expired or is now held by someone else.
	ErrLockNotHeld = errors.New("cache: lock not held")

	// ErrEmptyKey is returned for an empty key: it is almost always a bug in
	// the caller (an unset ID), and caching under "" would merge unrelated
	// values.
	ErrEmptyKey = errors.New("cache: empty key")

	// ErrNilLoader is returned by [Cache.GetOrLoad] when the loader is nil.
	ErrNilLoader = errors.New("cache: nil loader")
)

// panicError is a loader panic turned into an error, so that every merged
// caller gets it instead of the process crashing in singleflight's goroutine.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string {
	return fmt.Sprintf("cache: loader panicked: %v\n\n%s", p.value, p.stack)
}

// Unwrap lets errors.Is see an error value the loader panicked with.
func (p *panicError) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// errGoexit is returned when the loader called runtime.Goexit (t.FailNow
// inside a loader, say): singleflight would otherwise never answer the callers.
var errGoexit = errors.New("cache: loader called runtime.Goexit")

// callLoader runs load in a goroutine of its own, so that a panic becomes a
// *panicError and a runtime.Goexit becomes errGoexit instead of ending the
// flight's goroutine with every caller still waiting. Loads are misses, where
// a goroutine costs nothing next to the database.
func callLoader[V any](ctx context.Context, load func(context.Context) (V, error)) (v V, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		returned := false
		defer func() {
			if r := recover(); r != nil {
				err = &panicError{value: r, stack: debug.Stack()}
			} else if !returned {
				err = errGoexit
			}
		}()
		v, err = load(ctx)
		returned = true
	}()
	<-done
	return v, err
}
