// This file defines the errors the package returns and how a loader panic
// becomes one.

package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotFound is what a loader returns to say the value does not exist
	// (wrapped or not). It is cached for the not-found TTL (see
	// [WithNotFoundTTL]), and every caller until that record expires, the
	// one whose loader returned it included, gets the same error: ErrNotFound
	// wrapped with the key, `cache: not found: "product:7"`. The loader's
	// own wrapping is not kept: a cached not-found could not give it back,
	// and an error that changed with the path it took would be a trap. Match
	// it with errors.Is.
	ErrNotFound = errors.New("cache: not found")

	// ErrCacheMiss is returned by [Cache.Get] when Redis holds no value for
	// the key. (A cached not-found is [ErrNotFound] instead.)
	ErrCacheMiss = errors.New("cache: miss")

	// ErrRefreshFailed is the Err of an [EventStaleServed] when the value is
	// served because its refresh failed (see [WithStale]).
	ErrRefreshFailed = errors.New("cache: refresh failed; stale value served")

	// ErrLockNotAcquired is returned (wrapped, naming the key and the budget)
	// when a caller of [Cache.GetOrLoad] used its whole retry budget (see
	// [WithRetry]) without finding a value or taking the load lock, because
	// another holder is still loading. When a context ended the wait,
	// it is joined with that context's error.
	ErrLockNotAcquired = errors.New("cache: lock not acquired")

	// ErrLoadLockLost is wrapped in the error hook's report (and is the Err
	// of [EventLockLost]) of a loaded value not stored because its load lock
	// ran out while the holder was held up. A lock voided by a Delete or Set
	// is not an error: see [EventLoadVoided].
	ErrLoadLockLost = errors.New("cache: load lock lost")

	// ErrEmptyKey is returned for an empty key: it is almost always a bug in
	// the caller (an unset ID), and caching under "" would merge unrelated
	// values.
	ErrEmptyKey = errors.New("cache: empty key")

	// ErrReservedKey is returned for a key (prefix included) that is the
	// load lock name of another key ("product:42{5716}:stampede:lock", see
	// [LockKey]), so that a value can never be stored where a lock lives,
	// or a near caches' lease registry ("{T}:stampede:near:"+prefix, for
	// any prefix; prefix+"{T}:stampede:near" of earlier versions).
	ErrReservedKey = errors.New("cache: key has the reserved shape of a lock name")

	// ErrCircuitOpen is returned under [FailClosed] while the circuit breaker
	// keeps calls away from an unreachable Redis (see [WithCircuitBreaker]).
	ErrCircuitOpen = errors.New("cache: circuit breaker open: Redis unreachable")

	// ErrNilLoader is returned by [Cache.GetOrLoad] when the loader is nil.
	ErrNilLoader = errors.New("cache: nil loader")
)

// PanicError is a panic in a function the caller passed (the loader, the
// codec, the observer) turned into an error, so that the process does not
// crash, whichever goroutine ran it. A panic in the loader or the codec is
// returned to every caller that needed that work (decoding a caller's copy:
// to that caller); a panic in the observer is not returned to anyone, it
// goes to [WithErrorHook] and the work goes on (see [WithObserver]). Match
// it with errors.As; errors.Is sees an error value the function panicked
// with. The message names where the panic happened: "loader", "codec",
// "observer", or "flight" and "batch" for the cache's own work around them.
type PanicError struct {
	Value any    // what the function passed to panic
	in    string // "loader", "codec", "observer", "flight" or "batch"
	stack []byte
}

// Error is one line; the stack is in Stack and in the %+v format.
func (p *PanicError) Error() string {
	return fmt.Sprintf("cache: %s panicked: %v", p.in, p.Value)
}

// Stack returns the stack of the goroutine that panicked.
func (p *PanicError) Stack() []byte { return p.stack }

// Format prints the stack after the message for %+v.
func (p *PanicError) Format(f fmt.State, verb rune) {
	io.WriteString(f, p.Error())
	if verb == 'v' && f.Flag('+') {
		fmt.Fprintf(f, "\n\n%s", p.stack)
	}
}

// Unwrap lets errors.Is see an error value the loader panicked with.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// errGoexit is returned when the loader called runtime.Goexit (t.FailNow
// inside a loader, say): singleflight would otherwise never answer the callers.
var errGoexit = errors.New("cache: loader called runtime.Goexit")

type loaded[V any] struct {
	v   V
	err error
}

// callLoader runs load in a goroutine of its own and waits for it until ctx
// ends. A panic becomes a *PanicError and runtime.Goexit becomes errGoexit,
// instead of ending the flight's goroutine with every caller still waiting.
// A loader that outlives ctx is abandoned: its callers get an error and the
// lock is released, and its goroutine ends when it returns. Loads are misses,
// where a goroutine costs nothing next to the database.
func callLoader[V any](ctx context.Context, load func(context.Context) (V, error)) (V, error) {
	ch := make(chan loaded[V], 1)
	go func() {
		r := loaded[V]{err: errGoexit} // kept only if load never returns
		defer func() {
			if p := recover(); p != nil {
				r = loaded[V]{err: &PanicError{in: "loader", Value: p, stack: debug.Stack()}}
			}
			ch <- r
		}()
		r.v, r.err = load(ctx)
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero V
		return zero, fmt.Errorf("cache: loader still running at the load timeout: %w", ctx.Err())
	}
}

// notFound is the error of a not-found at key, whichever path found it.
func notFound(key string) error { return fmt.Errorf("%w: %q", ErrNotFound, key) }

// under puts err under msg on one line, saying the package's "cache: "
// once: `cache: GetOrLoadMany: keys[1]: empty key`, not `...: cache: empty
// key`. errors.Is and errors.As see err.
func under(msg string, err error) error { return &underError{msg, err} }

type underError struct {
	msg string
	err error
}

func (e *underError) Error() string {
	return e.msg + ": " + strings.TrimPrefix(e.err.Error(), "cache: ")
}

func (e *underError) Unwrap() error { return e.err }

// keyErrors is the error of a batch in which some keys failed: each key's
// error as GetOrLoad would give it, named by its key, on one line,
// "; "-separated. errors.Is and errors.As see each key's error.
type keyErrors []error

// joinKeys returns errs as one error (nil if none): errs[i] is the error
// of the caller's key names[i], full[i] with the prefix. Each is named by
// the caller's key, unless its message names the key already.
func joinKeys(names, full []string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	out := make(keyErrors, len(errs))
	for i, err := range errs {
		msg, q := err.Error(), strconv.Quote(names[i])
		if strings.Contains(msg, q) || strings.Contains(msg, strconv.Quote(full[i])) {
			out[i] = err
		} else {
			out[i] = &keyError{q, err}
		}
	}
	return out
}

func (e keyErrors) Error() string {
	var b strings.Builder
	for i, err := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e keyErrors) Unwrap() []error { return e }

// keyError names the key of an error that does not: `db down (key "7")`.
type keyError struct {
	quoted string // the key, quoted
	err    error
}

func (e *keyError) Error() string { return e.err.Error() + " (key " + e.quoted + ")" }

func (e *keyError) Unwrap() error { return e.err }

// errsOf is the errors of cmds, index-aligned.
func errsOf[C redis.Cmder](cmds []C) []error {
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
	}
	return errs
}
