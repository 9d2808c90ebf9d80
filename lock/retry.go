// This file is the standalone lock's retry strategy: how long Obtain and
// ObtainQuorum wait before each further attempt, and when they give up.

package lock

import (
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"time"
)

// RetryStrategy says how long [Obtain] and [ObtainQuorum] wait before each
// retry after a failed attempt, and when they stop retrying. Build one with
// [NoRetry], [LinearBackoff], [ExponentialBackoff], [LimitRetry] or
// [RetryFunc]; the zero value never retries.
//
// A RetryStrategy is a value that holds no state: each call draws a fresh
// sequence of waits from [RetryStrategy.Backoffs] and counts its own retries,
// so one strategy can be shared by any number of goroutines and calls. (The
// counting strategies of github.com/bsm/redislock are shared objects, which
// made concurrent lockers use up one another's retries.)
//
// A strategy built from invalid values (a negative wait, a negative limit)
// makes the call that uses it return an error; it never panics.
type RetryStrategy struct {
	// delay returns the wait before retry n (1-based), or false to stop. It
	// is a pure function of n (random jitter aside); nil never retries.
	delay func(n int) (time.Duration, bool)
	err   error // why the strategy is invalid, reported by the call that uses it
}

// NoRetry makes one attempt and no retry: a lock held by someone else gives
// [ErrNotObtained] at once. It is the default of [Obtain] and
// [ObtainQuorum], for the jobs where the other instances should skip the
// work rather than queue for it.
func NoRetry() RetryStrategy { return RetryStrategy{} }

// LinearBackoff retries every backoff, with no limit of its own: combine it
// with [LimitRetry] or a context deadline. backoff must be positive.
func LinearBackoff(backoff time.Duration) RetryStrategy {
	if backoff <= 0 {
		return invalidRetry(fmt.Errorf("lock: LinearBackoff(%v): backoff must be positive", backoff))
	}
	return RetryStrategy{delay: func(int) (time.Duration, bool) { return backoff, true }}
}

// ExponentialBackoff retries with waits that double from min up to max, with
// "equal jitter": the wait before retry n is drawn uniformly from [b/2, b],
// where b = min·2^(n-1), capped at max. The jitter keeps instances that
// failed together from retrying together. It has no limit of its own: combine
// it with [LimitRetry] or a context deadline. It needs 0 < min <= max.
func ExponentialBackoff(min, max time.Duration) RetryStrategy {
	if min <= 0 || max < min {
		return invalidRetry(fmt.Errorf("lock: ExponentialBackoff(%v, %v): need 0 < min <= max", min, max))
	}
	return RetryStrategy{delay: func(n int) (time.Duration, bool) {
		b := min
		for i := 1; i < n && b < max; i++ {
			b *= 2 // no overflow: b < max before doubling
		}
		if b > max || b <= 0 {
			b = max
		}
		half := b / 2
		return half + rand.N(b-half+1), true
	}}
}

// LimitRetry allows at most retries retries of s (so retries+1 attempts in
// all), each call counting its own. LimitRetry(s, 0) is [NoRetry]. retries
// must not be negative.
func LimitRetry(s RetryStrategy, retries int) RetryStrategy {
	switch {
	case s.err != nil:
		return s
	case retries < 0:
		return invalidRetry(fmt.Errorf("lock: LimitRetry(%d): retries must not be negative", retries))
	case s.delay == nil:
		return s
	}
	return RetryStrategy{delay: func(n int) (time.Duration, bool) {
		if n > retries {
			return 0, false
		}
		return s.delay(n)
	}}
}

// RetryFunc makes a strategy of f, which returns the wait before retry n
// (1, 2, ...) or false to stop. f must be safe for concurrent use: calls
// share it. A wait of zero retries at once; a negative wait ends the call
// with an error.
func RetryFunc(f func(n int) (time.Duration, bool)) RetryStrategy {
	if f == nil {
		return invalidRetry(errors.New("lock: RetryFunc(nil)"))
	}
	return RetryStrategy{delay: f}
}

func invalidRetry(err error) RetryStrategy {
	return RetryStrategy{err: err, delay: func(int) (time.Duration, bool) { return 0, false }}
}

// Backoffs returns the waits of one call, in order: the wait before the
// first retry, then before the second, and so on until the strategy stops.
// Each call to Backoffs starts from the beginning.
func (s RetryStrategy) Backoffs() iter.Seq[time.Duration] {
	return func(yield func(time.Duration) bool) {
		if s.delay == nil {
			return
		}
		for n := 1; ; n++ {
			d, ok := s.delay(n)
			if !ok || !yield(d) {
				return
			}
		}
	}
}
