// This file defines the errors the lock returns.

package lock

import (
	"context"
	"errors"
	"fmt"
)

var (
	// ErrNotObtained is returned (wrapped, naming the key) by [Obtain],
	// [ObtainQuorum] and [Do] when someone else holds the lock after the
	// retries [WithRetry] allows. When a context ended the wait, the error
	// wraps that context's error too (errors.Is matches both).
	ErrNotObtained = errors.New("lock: not obtained")

	// ErrNotHeld is returned by [Lock.Release], [Lock.Refresh], [Lock.TTL]
	// and [Lock.Hold] when the lock has expired or is now held by someone
	// else, and by every one of them on a nil *Lock.
	ErrNotHeld = errors.New("lock: not held")

	// ErrEmptyKey is returned for an empty key: it is almost always a bug in
	// the caller (an unset ID).
	ErrEmptyKey = errors.New("lock: empty key")
)

// notObtained is [ErrNotObtained] for key, one line, wrapping the context's
// error when ctx ended the wait and last, the error of the last attempt
// (a quorum round's), if any.
func notObtained(ctx context.Context, key string, last error) error {
	err := fmt.Errorf("%w: %q", ErrNotObtained, key)
	if cerr := ctx.Err(); cerr != nil {
		err = fmt.Errorf("%w: %w", err, cerr)
	}
	if last != nil {
		err = fmt.Errorf("%w (last attempt: %w)", err, last)
	}
	return err
}
