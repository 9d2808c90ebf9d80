// options.go holds the functional options of [New], their defaults and
// their validation.

package cache

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// Defaults. Each is repeated, with its reason, on the option that changes it.
const (
	DefaultTTL         = time.Hour
	DefaultNotFoundTTL = time.Minute
	DefaultLockTTL     = 5 * time.Second
	DefaultBackoff     = 100 * time.Millisecond
	DefaultJitter      = 0.1
	DefaultLoadTimeout = 30 * time.Second

	DefaultBreakerFailures = 5
	DefaultBreakerCoolDown = time.Second

	DefaultEarlyRefresh  = 1.0
	DefaultStaleThrottle = 5 * time.Second
)

// FailurePolicy says what [Cache.GetOrLoad] does when Redis cannot be reached
// or a Redis call fails.
type FailurePolicy int

const (
	// FailOpen calls the loader without the cross-process lock and returns its
	// value uncached; so it does when Redis, out of memory, refuses the lock
	// (while still serving hits: the breaker stays closed). In-process callers of one key are still merged, so the
	// database sees at most one load per key per process at a time. This is
	// the default: a cache outage slows the service down instead of taking it
	// down.
	FailOpen FailurePolicy = iota
	// FailClosed returns the Redis error and never calls the loader without
	// the lock: for sources that must never see more than one load at a time.
	FailClosed
)

// Option configures a [Cache] (see [New]).
type Option func(*config)

type config struct {
	prefix      string
	ttl         time.Duration
	notFoundTTL time.Duration
	lockTTL     time.Duration
	retry       retryPolicy
	retrySet    bool // WithRetry given; otherwise the budget follows the load timeout
	jitter      float64
	loadTimeout time.Duration
	codec       Codec
	policy      FailurePolicy
	onError     func(key string, err error)
	observer    func(Event)
	beta        float64       // XFetch's beta; 0: no early refresh
	stale       time.Duration // how long past its TTL a value may be served; 0: never
	throttle    time.Duration // after a failed refresh, serve the stale value this long before retrying
	softTimeout time.Duration // how long a stale read waits for its refresh; 0: not at all
	breaker     struct {
		failures int // 0: off
		coolDown time.Duration
	}
	near nearConfig // see near.go

	logger *slog.Logger // nil: slog.Default()
	logOff bool         // WithLogger(nil)

	replicaReads bool // see replica.go
}

func newConfig(opts []Option) config {
	c := config{
		ttl:         DefaultTTL,
		notFoundTTL: DefaultNotFoundTTL,
		lockTTL:     DefaultLockTTL,
		retry:       retryPolicy{backoff: DefaultBackoff},
		jitter:      DefaultJitter,
		loadTimeout: DefaultLoadTimeout,
		codec:       JSON,
		policy:      FailOpen,
		beta:        DefaultEarlyRefresh,
		throttle:    DefaultStaleThrottle,
	}
	for _, o := range opts {
		if o == nil {
			panic(errors.New("cache: nil Option"))
		}
		o(&c)
	}
	if c.breaker.failures == 0 && c.breaker.coolDown == 0 {
		c.breaker.failures, c.breaker.coolDown = DefaultBreakerFailures, DefaultBreakerCoolDown
	}
	if !c.retrySet && c.loadTimeout > 0 { // a waiter waits as long as a holder may legitimately load
		c.retry.max = int((c.loadTimeout + c.retry.backoff - 1) / c.retry.backoff)
	}
	if err := c.validate(); err != nil {
		panic(err)
	}
	if err := c.near.validate(); err != nil {
		panic(err)
	}
	return c
}

func (c *config) validate() error {
	switch {
	case c.ttl <= 0:
		return fmt.Errorf("cache: WithTTL(%v): TTL must be positive", c.ttl)
	case c.ttl < time.Millisecond:
		return fmt.Errorf("cache: WithTTL(%v): Redis expiries have millisecond resolution", c.ttl)
	case c.notFoundTTL < 0:
		return fmt.Errorf("cache: WithNotFoundTTL(%v): TTL must not be negative", c.notFoundTTL)
	case c.notFoundTTL > 0 && c.notFoundTTL < time.Millisecond:
		return fmt.Errorf("cache: WithNotFoundTTL(%v): Redis expiries have millisecond resolution", c.notFoundTTL)
	case c.lockTTL < 3*time.Millisecond:
		return fmt.Errorf("cache: WithLockTTL(%v): lock TTL must be at least 3ms (the watchdog refreshes every TTL/3)", c.lockTTL)
	case c.retry.max < 0:
		return fmt.Errorf("cache: WithRetry(%d, %v): maxRetries must not be negative", c.retry.max, c.retry.backoff)
	case c.retry.max > 0 && c.retry.backoff <= 0:
		return fmt.Errorf("cache: WithRetry(%d, %v): backoff must be positive when retrying", c.retry.max, c.retry.backoff)
	case !(c.jitter >= 0 && c.jitter < 1): // also rejects NaN
		return fmt.Errorf("cache: WithJitter(%v): fraction must be in [0, 1)", c.jitter)
	case c.loadTimeout <= 0:
		return fmt.Errorf("cache: WithLoadTimeout(%v): timeout must be positive", c.loadTimeout)
	case c.codec == nil:
		return fmt.Errorf("cache: WithCodec(nil): codec must not be nil")
	case c.breaker.failures < 0 || c.breaker.failures > math.MaxInt32 || c.breaker.failures > 0 && c.breaker.coolDown <= 0:
		return fmt.Errorf("cache: WithCircuitBreaker(%d, %v): failures must be positive and the cool-down positive", c.breaker.failures, c.breaker.coolDown)
	case !(c.beta >= 0 && c.beta <= 100):
		return fmt.Errorf("cache: WithEarlyRefresh(%v): beta must be in [0, 100]", c.beta)
	case c.stale < 0:
		return fmt.Errorf("cache: WithStale(%v): duration must not be negative", c.stale)
	case c.throttle < time.Millisecond:
		return fmt.Errorf("cache: WithStaleThrottle(%v): throttle must be at least 1ms", c.throttle)
	case c.softTimeout < 0:
		return fmt.Errorf("cache: WithSoftLoadTimeout(%v): timeout must not be negative", c.softTimeout)
	case c.policy != FailOpen && c.policy != FailClosed:
		return fmt.Errorf("cache: WithFailurePolicy(%d): unknown policy", c.policy)
	}
	return nil
}

// WithTTL sets how long a loaded value stays in Redis, before jitter (see
// [WithJitter]). Default: 1h ([DefaultTTL]). It must be at least 1ms; [New]
// panics otherwise.
func WithTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// WithNotFoundTTL sets how long an [ErrNotFound] from the loader is cached, so
// that lookups of absent keys do not reach the database on every call.
// Default: 1m ([DefaultNotFoundTTL]). Zero turns negative caching off: every
// lookup of an absent key then costs a (merged, locked) load. Negative values
// make [New] panic.
func WithNotFoundTTL(d time.Duration) Option { return func(c *config) { c.notFoundTTL = d } }

// WithLockTTL sets the lease of the load lock. While the loader runs, a
// watchdog extends the lease every d/3, so d does not bound the load time; it
// bounds how long a crashed or frozen holder blocks everyone else. Default: 5s
// ([DefaultLockTTL]), long enough that a GC pause or a slow Redis round trip
// does not lose a live holder's lock, short enough that a crashed holder is
// replaced within one retry budget. Minimum 3ms.
func WithLockTTL(d time.Duration) Option { return func(c *config) { c.lockTTL = d } }

// WithRetry sets the waiter budget: after a first lock attempt that finds
// another holder, up to maxRetries more attempts, each after waiting up to
// backoff (cut short when the holder's notification arrives, or by the
// shared load's context) and each re-reading the cache in the same round
// trip. When the budget is spent the caller gets an error wrapping
// [ErrLockNotAcquired] that names the key and the budget. Default: 100ms
// ([DefaultBackoff]) and as many retries as fit in the load timeout (300 for
// the default 30s, see [WithLoadTimeout]): a waiter waits as long as the
// holder may legitimately load, and a crashed holder's lease (5s) runs out
// well within it. maxRetries 0 means one attempt and no waiting. Negative
// maxRetries, or a non-positive backoff with retries, make [New] panic.
func WithRetry(maxRetries int, backoff time.Duration) Option {
	return func(c *config) { c.retry, c.retrySet = retryPolicy{max: maxRetries, backoff: backoff}, true }
}

// WithCircuitBreaker sets when the cache stops calling an unreachable Redis:
// after failures consecutive Redis calls fail without a reply (refused
// connections, timeouts), Redis is skipped for coolDown; then one call
// probes it, and its success closes the breaker. While open, [FailOpen]
// calls the loader at once (still merged per key in the process) and
// [FailClosed] returns [ErrCircuitOpen]: an outage costs microseconds per
// call, not the client's dial retries. Replies that are errors (a wrong
// password, say) never open it, nor does Redis refusing writes for want of
// memory (OOM: it still serves reads). The caches of one client with the
// same settings share one breaker, so that an outage one meets keeps all
// of them off Redis at once, and each of them hears [EventBreakerOpen] and
// [EventBreakerClose] once per transition, whichever Cache's call caused
// it (the event's Key is that call's key); caches with other settings have
// their own. While open, calls get an error matching [ErrCircuitOpen] that names
// the address and the failure that opened it. Default: 5 failures, 1s
// ([DefaultBreakerFailures], [DefaultBreakerCoolDown]). See
// [WithoutCircuitBreaker].
func WithCircuitBreaker(failures int, coolDown time.Duration) Option {
	return func(c *config) { c.breaker.failures, c.breaker.coolDown = failures, coolDown }
}

// WithoutCircuitBreaker makes every call try Redis, however long it has been
// down.
func WithoutCircuitBreaker() Option {
	return func(c *config) { c.breaker.failures, c.breaker.coolDown = 0, -1 }
}

// WithJitter spreads expiries of values loaded together: each TTL is drawn
// uniformly from [ttl*(1-fraction), ttl*(1+fraction)]. Default: 0.1
// ([DefaultJitter]). fraction must be in [0, 1). See [WithoutJitter].
func WithJitter(fraction float64) Option { return func(c *config) { c.jitter = fraction } }

// WithoutJitter stores every value for exactly its TTL.
func WithoutJitter() Option { return WithJitter(0) }

// WithLoadTimeout bounds the shared work of one key in one process: the
// lock wait and the loader, which receives a context with this deadline. A
// loader still running at the deadline is abandoned: its callers get an error
// wrapping context.DeadlineExceeded and the lock is released, so that the
// next caller can load. Redis calls honour the deadline only if the client
// sets ContextTimeoutEnabled; otherwise the client's own read and write
// timeouts bound them. Callers stop waiting earlier when their own context
// ends. Default: 30s ([DefaultLoadTimeout]).
func WithLoadTimeout(d time.Duration) Option { return func(c *config) { c.loadTimeout = d } }

// WithCodec sets how values are encoded. Default: [JSON].
func WithCodec(codec Codec) Option { return func(c *config) { c.codec = codec } }

// WithPrefix is prepended to every key given to the Cache, for
// example "svc:products:". Default: none, so the value lives at exactly the
// key and other programs can read or delete it.
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithFailurePolicy sets what happens when Redis fails. Default: [FailOpen].
func WithFailurePolicy(p FailurePolicy) Option { return func(c *config) { c.policy = p } }

// WithErrorHook is called with the errors the cache handles without
// returning them to a caller: a Redis error that [FailOpen] turned into an
// uncached load, a loaded value not stored because the lock was lost (the
// error wraps [ErrLoadLockLost]: a Delete ran or the lease lapsed), a failed
// commit or lock release, and once per episode of memory pressure, the
// first OOM reply of Redis named as such (its writes are refused while
// reads still work: the cache serves hits and returns loaded values
// uncached). Use it for logs and metrics; the cache itself logs only what
// [WithLogger] says. fn runs on the loading goroutine, so it must be quick and safe
// for concurrent use. Default: none.
func WithErrorHook(fn func(key string, err error)) Option {
	return func(c *config) { c.onError = fn }
}

// WithEarlyRefresh sets how eagerly a hit refreshes its value before the TTL
// ends, so that a hot key never expires in front of its callers. A hit
// refreshes in the background once now is within load*max(1, beta*-ln(u))
// of the expiry, where load is how long the value took to load and u is
// uniform in (0, 1]: XFetch (Vattani, Chierichetti and Lowenstein, VLDB
// 2015) with one draw per stored value shared by all processes, and a floor
// of one load duration so that the refresh normally ends before the TTL
// does. The refresh takes the key's load lock and commits fenced like a
// load, so it runs once per key across processes; callers keep getting the
// current value meanwhile, and a value whose refresh is late is still
// served for a grace of three load durations past its TTL (longer with
// [WithStale]). A process whose refresh found the lock taken does not try
// again for a retry backoff; one whose refresh failed, for the stale
// throttle ([WithStaleThrottle]).
//
// Default: 1 ([DefaultEarlyRefresh]), the paper's optimum: the refresh
// starts on average about 1.4 load durations before expiry, however many
// processes read the key, so a hot key is loaded about once per TTL (1.03
// times expected at a TTL of 12.5 load durations, 1.02 measured) and cold
// keys, which see no hit near their expiry, never. Larger beta refreshes earlier; 0 turns it off. beta
// must be in [0, 100].
func WithEarlyRefresh(beta float64) Option { return func(c *config) { c.beta = beta } }

// WithStale keeps values in Redis for d past their TTL and serves them
// (fail-safe): a value past its TTL is returned at once while one refresh
// runs in the background (stale-while-revalidate; see
// [WithSoftLoadTimeout] to wait for it a little), and when that refresh
// fails, the stale value goes on being served (stale-if-error): its error
// goes to [WithErrorHook] and the observer, and the value is not retried for
// [WithStaleThrottle], so a failing database is not hammered, for as long
// as the database fails. A caller can tell a stale value through
// [WithResultInfo] or [EventStaleServed]. Default: 0, off: a value past its
// TTL is a miss. Negative d makes [New] panic.
func WithStale(d time.Duration) Option { return func(c *config) { c.stale = d } }

// WithStaleThrottle sets how long a stale value is served without retrying
// its refresh after a refresh failed. Default: 5s ([DefaultStaleThrottle]).
// At least 1ms.
func WithStaleThrottle(d time.Duration) Option { return func(c *config) { c.throttle = d } }

// WithSoftLoadTimeout makes a read that finds a stale value (see
// [WithStale]) wait up to d for its refresh, returning the fresh value when
// the database answers in time and the stale one otherwise, while the
// refresh goes on in the background. Default: 0, the stale value is
// returned at once.
func WithSoftLoadTimeout(d time.Duration) Option { return func(c *config) { c.softTimeout = d } }

// WithLogger sets where the cache reports, once each, the first failure of
// a Redis outage (naming the address and the cause), the end of that outage
// and the beginning of a memory-pressure episode (see [WithErrorHook]): the
// problems a service would otherwise absorb without anyone seeing them, as
// [FailOpen] does. It never logs per call. The caches of one client log
// each event once per logger, through the loggers of all of them. nil turns
// it off. Default: [slog.Default] at the time of logging.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.logOff = l, l == nil }
}
