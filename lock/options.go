// This file holds the options of the standalone lock ([Obtain],
// [ObtainQuorum], [Do]), their defaults and their validation.

package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/stampede-go/stampede/internal/token"
)

// Option configures one call of [Obtain], [ObtainQuorum] or [Do]. The
// lock takes only Options, never the cache's [Option]s. An invalid option
// makes the call return an error (naming the option), without touching Redis;
// lock functions never panic on their input. (The cache package's options,
// given once to cache.New at start-up, panic there instead: see
// cache.Option.)
type Option func(*config)

type config struct {
	retry      RetryStrategy
	metadata   string
	prefix     string
	token      string        // "" until WithToken: a random token
	tokenSet   bool          // WithToken was given
	quorumWait time.Duration // 0 until WithQuorumWait: a tenth of the TTL
	waitSet    bool          // WithQuorumWait was given
	observer   func(Event)   // nil: none
	errs       []error       // what the options found wrong
}

// WithRetry sets what happens when the lock is held by someone else:
// wait and retry as s says (see [RetryStrategy]), or give up at once.
// Default: [NoRetry], one attempt. However s retries, the call also ends when
// its context does, with [ErrNotObtained] joined with ctx.Err().
func WithRetry(s RetryStrategy) Option {
	return func(c *config) {
		if s.err != nil {
			c.errs = append(c.errs, fmt.Errorf("WithRetry: %w", s.err))
		}
		c.retry = s
	}
}

// WithMetadata stores md with the lock, after the token, so that an
// operator reading the key sees who holds it (a host name, a job ID).
// [Lock.Metadata] returns it. Default: none.
func WithMetadata(md string) Option {
	return func(c *config) { c.metadata = md }
}

// WithPrefix puts prefix before the key, as the cache's [WithPrefix]
// does for values ("myapp:lock:" + key). Default: none, the lock lives at
// exactly key.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithToken sets the token that identifies the holder instead of 128
// random bits (32 hex digits, the default). A holder that knows the token
// can obtain the lock again while it holds it, for example after a restart,
// which renews the lease, replaces the metadata and takes a new fence (see
// [Lock.Fence]). Tokens must be unique to each holder and must not be
// prefixes of one another: the lock compares the start of the stored value
// with the token. token must not be empty.
func WithToken(token string) Option {
	return func(c *config) {
		if token == "" {
			c.errs = append(c.errs, errors.New(`WithToken(""): token must not be empty`))
		}
		c.token, c.tokenSet = token, true
	}
}

// WithQuorumWait sets how long [ObtainQuorum], and then the quorum lock's
// Refresh, TTL and Release, wait for the masters' answers in one round. A
// master that has not answered by then counts as failed; it must be small
// next to the TTL, since the time spent waiting is taken from the lock's
// validity. Default: a tenth of the TTL. d must be positive. It applies to
// [ObtainQuorum] only; [Obtain] returns an error if given it.
func WithQuorumWait(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("WithQuorumWait(%v): wait must be positive", d))
		}
		c.quorumWait, c.waitSet = d, true
	}
}

// WithObserver sends the lock's events to fn: each acquisition and
// give-up of the call, with how long it waited and how many attempts it
// made, and for the Lock it returns, a loss found at a renewal or at
// Release and the fence refusals the application reports (see [Event]).
// The Lock keeps fn for its later events. fn is called synchronously, on
// the caller's goroutine or the lock's own (Hold's watchdog), so it must be
// quick, must not block, and must be safe for concurrent use. Given more
// than once, every fn gets every event, in the order given (metrics and
// logs, say). Default: none, at no cost.
//
// A panic in fn does not break the lock: it is recovered, the other
// observers still get the event, and the call goes on as if fn had
// returned. The lock has no error hook to hand the panic to: it is
// dropped.
func WithObserver(fn func(Event)) Option {
	return func(c *config) {
		if prev := c.observer; prev != nil && fn != nil {
			c.observer = func(e Event) { defer fn(e); prev(e) } // deferred: fn gets e even if prev panics
			return
		}
		if fn != nil {
			c.observer = fn
		}
	}
}

// newConfig applies opts and checks them with the key and TTL, for the
// function op ("Obtain", "ObtainQuorum", "Do").
func newConfig(op, key string, ttl time.Duration, quorum bool, opts []Option) (config, error) {
	var c config
	for i, o := range opts {
		if o == nil {
			c.errs = append(c.errs, fmt.Errorf("option %d is nil", i))
			continue
		}
		o(&c)
	}
	switch {
	case key == "":
		c.errs = append(c.errs, ErrEmptyKey)
	case ttl < time.Millisecond:
		c.errs = append(c.errs, fmt.Errorf("ttl %v: must be at least 1ms (Redis expiries have millisecond resolution)", ttl))
	case !quorum && c.waitSet:
		c.errs = append(c.errs, errors.New("WithQuorumWait applies to ObtainQuorum only"))
	}
	if len(c.errs) > 0 {
		err := errors.Join(c.errs...)
		if len(c.errs) == 1 && errors.Is(err, ErrEmptyKey) {
			return c, ErrEmptyKey
		}
		return c, fmt.Errorf("lock: %s: %w", op, err)
	}
	if !c.tokenSet {
		c.token = token.NewToken()
	}
	if !c.waitSet {
		c.quorumWait = ttl / 10
	}
	return c, nil
}

// leaseMillis is ttl in whole milliseconds for PX and PEXPIRE, rounded up so
// that Redis never keeps the lock for less than the caller assumes.
func leaseMillis(ttl time.Duration) int64 {
	ms := int64(ttl / time.Millisecond)
	if ttl%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// clockDrift is the margin taken from every lease before the holder counts
// on it, as the Redlock algorithm prescribes: 1% of the TTL for the drift
// between the clocks of the client and the servers, plus 2ms for the
// millisecond resolution of Redis expiries.
func clockDrift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}
