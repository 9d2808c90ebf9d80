// This file holds the functional options of [New], their defaults and
// their validation.

package cache

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/stampede-go/stampede/internal/slot"
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

// Option configures a [Cache] (see [New]). Options are given once, when
// the Cache is made at start-up, so an invalid one makes [New] panic with
// a message naming it, as regexp.MustCompile does: a programming error
// found before any request. The lock package's options are given on every
// call instead, often from data, so there an invalid option is the call's
// error. [WithRetry] takes a count and a backoff here, where a wait ends
// early on the holder's notification and the backoff is only its bound;
// lock.WithRetry takes a lock.RetryStrategy, whose waits are the whole
// policy.
type Option func(*config)

type config struct {
	counts      *counters // what Stats reports; shared by the copies a Cache's machinery keeps
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
	near nearConfig // see newNear

	logger *slog.Logger // nil: slog.Default()
	logOff bool         // WithLogger(nil)

	replicaReads bool // see WithReplicaReads
	tags         bool // see WithTags
}

// testNearPerKey makes WithNearPerKey the default: the package's tests run
// their whole suite with it when STAMPEDE_NEAR_PERKEY is set (main_test.go).
var testNearPerKey bool

func newConfig(opts []Option) config {
	c := config{
		counts:      &counters{},
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
	c.near.perKey = testNearPerKey
	for _, o := range opts {
		if o == nil {
			panic(errors.New("cache: nil Option"))
		}
		o(&c)
	}
	c.quietBreaker()
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

func (cfg *config) validate() error {
	switch {
	case cfg.ttl <= 0:
		return fmt.Errorf("cache: WithTTL(%v): TTL must be positive", cfg.ttl)
	case cfg.ttl < time.Millisecond:
		return fmt.Errorf("cache: WithTTL(%v): Redis expiries have millisecond resolution", cfg.ttl)
	case cfg.notFoundTTL < 0:
		return fmt.Errorf("cache: WithNotFoundTTL(%v): TTL must not be negative", cfg.notFoundTTL)
	case cfg.notFoundTTL > 0 && cfg.notFoundTTL < time.Millisecond:
		return fmt.Errorf("cache: WithNotFoundTTL(%v): Redis expiries have millisecond resolution", cfg.notFoundTTL)
	case cfg.lockTTL < 3*time.Millisecond:
		return fmt.Errorf("cache: WithLockTTL(%v): lock TTL must be at least 3ms (the watchdog refreshes every TTL/3)", cfg.lockTTL)
	case cfg.retry.max < 0:
		return fmt.Errorf("cache: WithRetry(%d, %v): maxRetries must not be negative", cfg.retry.max, cfg.retry.backoff)
	case cfg.retry.max > 0 && cfg.retry.backoff <= 0:
		return fmt.Errorf("cache: WithRetry(%d, %v): backoff must be positive when retrying", cfg.retry.max, cfg.retry.backoff)
	case !(cfg.jitter >= 0 && cfg.jitter < 1): // also rejects NaN
		return fmt.Errorf("cache: WithJitter(%v): fraction must be in [0, 1)", cfg.jitter)
	case cfg.loadTimeout <= 0:
		return fmt.Errorf("cache: WithLoadTimeout(%v): timeout must be positive", cfg.loadTimeout)
	case cfg.codec == nil:
		return fmt.Errorf("cache: WithCodec(nil): codec must not be nil")
	case cfg.breaker.failures < 0 || cfg.breaker.failures > math.MaxInt32 || cfg.breaker.failures > 0 && cfg.breaker.coolDown <= 0:
		return fmt.Errorf("cache: WithCircuitBreaker(%d, %v): failures must be positive and the cool-down positive", cfg.breaker.failures, cfg.breaker.coolDown)
	case !(cfg.beta >= 0 && cfg.beta <= 100):
		return fmt.Errorf("cache: WithEarlyRefresh(%v): beta must be in [0, 100]", cfg.beta)
	case cfg.stale < 0:
		return fmt.Errorf("cache: WithStale(%v): duration must not be negative", cfg.stale)
	case cfg.throttle < time.Millisecond:
		return fmt.Errorf("cache: WithStaleThrottle(%v): throttle must be at least 1ms", cfg.throttle)
	case cfg.softTimeout < 0:
		return fmt.Errorf("cache: WithSoftLoadTimeout(%v): timeout must not be negative", cfg.softTimeout)
	case cfg.policy != FailOpen && cfg.policy != FailClosed:
		return fmt.Errorf("cache: WithFailurePolicy(%d): unknown policy", cfg.policy)
	case cfg.tags && !slot.HasUnder(cfg.prefix):
		return fmt.Errorf("cache: WithTags with WithPrefix(%q): the prefix's first '{' is closed at once, so no two keys beginning with it share a slot, as the tag versions must", cfg.prefix)
	}
	return nil
}

// WithTTL sets how long a loaded value stays in Redis, before jitter (see
// [WithJitter]). Default: 1h ([DefaultTTL]). It must be at least 1ms; [New]
// panics otherwise.
func WithTTL(d time.Duration) Option { return func(cfg *config) { cfg.ttl = d } }

// WithNotFoundTTL sets how long an [ErrNotFound] from the loader is cached, so
// that lookups of absent keys do not reach the database on every call.
// Default: 1m ([DefaultNotFoundTTL]). Zero turns negative caching off: every
// lookup of an absent key then costs a (merged, locked) load. Negative values
// make [New] panic.
func WithNotFoundTTL(d time.Duration) Option { return func(cfg *config) { cfg.notFoundTTL = d } }

// WithLockTTL sets the lease of the load lock. While the loader runs, a
// watchdog extends the lease every d/3, so d does not bound the load time; it
// bounds how long a crashed or frozen holder blocks everyone else. Default: 5s
// ([DefaultLockTTL]), long enough that a GC pause or a slow Redis round trip
// does not lose a live holder's lock, short enough that a crashed holder is
// replaced within one retry budget. Minimum 3ms.
func WithLockTTL(d time.Duration) Option { return func(cfg *config) { cfg.lockTTL = d } }

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
	return func(cfg *config) { cfg.retry, cfg.retrySet = retryPolicy{max: maxRetries, backoff: backoff}, true }
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
	return func(cfg *config) { cfg.breaker.failures, cfg.breaker.coolDown = failures, coolDown }
}

// WithoutCircuitBreaker makes every call try Redis, however long it has been
// down.
func WithoutCircuitBreaker() Option {
	return func(cfg *config) { cfg.breaker.failures, cfg.breaker.coolDown = 0, -1 }
}

// WithJitter spreads expiries of values loaded together: each TTL is drawn
// uniformly from [ttl*(1-fraction), ttl*(1+fraction)]. Default: 0.1
// ([DefaultJitter]). fraction must be in [0, 1). See [WithoutJitter].
func WithJitter(fraction float64) Option { return func(cfg *config) { cfg.jitter = fraction } }

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
func WithLoadTimeout(d time.Duration) Option { return func(cfg *config) { cfg.loadTimeout = d } }

// WithCodec sets how values are encoded. Default: [JSON].
func WithCodec(codec Codec) Option { return func(cfg *config) { cfg.codec = codec } }

// WithPrefix is prepended to every key given to the Cache, for
// example "svc:products:". Default: none, so the value lives at exactly the
// key and other programs can read or delete it.
func WithPrefix(prefix string) Option { return func(cfg *config) { cfg.prefix = prefix } }

// WithFailurePolicy sets what happens when Redis fails. Default: [FailOpen].
func WithFailurePolicy(p FailurePolicy) Option { return func(cfg *config) { cfg.policy = p } }

// WithErrorHook is called with the errors the cache handles without
// returning them to a caller: a Redis error that [FailOpen] turned into an
// uncached load, a loaded value not stored because the lock was lost (the
// error wraps [ErrLoadLockLost]: a Delete ran or the lease lapsed), a failed
// commit or lock release, and once per episode of memory pressure, the
// first OOM reply of Redis named as such (its writes are refused while
// reads still work: the cache serves hits and returns loaded values
// uncached). Use it for logs and metrics; the cache itself logs only what
// [WithLogger] says. fn runs on the loading goroutine, so it must be quick and safe
// for concurrent use. A call the open circuit breaker kept from Redis is
// not reported: the outage was, when it began (its failures, then
// [EventBreakerOpen] and the log), so an outage costs the hook a few
// calls, not one per request. Given more than once, every fn gets every
// error, in the order given (as [WithObserver]). Default: none.
func WithErrorHook(fn func(key string, err error)) Option {
	return func(cfg *config) {
		if prev := cfg.onError; prev != nil && fn != nil {
			cfg.onError = func(key string, err error) { defer fn(key, err); prev(key, err) } // deferred: fn hears it even if prev panics
			return
		}
		if fn != nil {
			cfg.onError = fn
		}
	}
}

// quietBreaker keeps from the error hook the errors of calls the open
// breaker kept from Redis, whichever path absorbed them.
func (cfg *config) quietBreaker() {
	hook := cfg.onError
	if hook == nil {
		return
	}
	cfg.onError = func(key string, err error) {
		if !errors.Is(err, ErrCircuitOpen) {
			hook(key, err)
		}
	}
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
func WithEarlyRefresh(beta float64) Option { return func(cfg *config) { cfg.beta = beta } }

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
func WithStale(d time.Duration) Option { return func(cfg *config) { cfg.stale = d } }

// WithStaleThrottle sets how long a stale value is served without retrying
// its refresh after a refresh failed. Default: 5s ([DefaultStaleThrottle]).
// At least 1ms.
func WithStaleThrottle(d time.Duration) Option { return func(cfg *config) { cfg.throttle = d } }

// WithSoftLoadTimeout makes a read that finds a stale value (see
// [WithStale]) wait up to d for its refresh, returning the fresh value when
// the database answers in time and the stale one otherwise, while the
// refresh goes on in the background. Default: 0, the stale value is
// returned at once.
func WithSoftLoadTimeout(d time.Duration) Option { return func(cfg *config) { cfg.softTimeout = d } }

// WithLogger sets where the cache reports, once each, the first failure of
// a Redis outage (naming the address and the cause), the end of that outage
// and the beginning of a memory-pressure episode (see [WithErrorHook]): the
// problems a service would otherwise absorb without anyone seeing them, as
// [FailOpen] does. It never logs per call. The caches of one client log
// each event once per logger, through the loggers of all of them. nil turns
// it off. Default: [slog.Default] at the time of logging.
func WithLogger(l *slog.Logger) Option {
	return func(cfg *config) { cfg.logger, cfg.logOff = l, l == nil }
}

// WithNearCache sets the byte budget of the near cache (keys, payloads and
// a per-entry overhead counted). The near cache is on by default, with a
// budget of 32 MiB; [WithoutNearCache] turns it off.
//
// The near cache keeps fresh values in process memory, so that hits of hot
// keys need no Redis round trip, and it keeps read-after-write: a
// GetOrLoad or Get that begins after a Delete or Set returned, in any
// process, does not get the old value from memory. Two mechanisms make it
// so:
//
//   - Invalidations: a value is dropped from every process's memory when
//     anything writes or deletes its key in Redis (this library in any
//     process, another program, redis-cli, an expiry or an eviction),
//     through Redis client-side caching in broadcast mode on one extra
//     connection per master. Give the cache a prefix ([WithPrefix]) so that
//     only its own keys are reported.
//   - Leases: Delete and Set return only once every other process whose
//     near cache may hold the key has acknowledged the invalidation, or its
//     coherence lease ([WithNearLease], 1s) has run out; a process serves
//     memory only while its lease runs, and renews it by proving, on its
//     invalidation connections, that it received everything sent before.
//     A write therefore also waits for the acknowledgements: a hop from
//     Redis to each other process and back (on a cluster, one more Redis
//     call too), measured at 3 to 7 round trips on a 2-core machine running
//     every process (BENCHMARKS.md), and up to one lease while a process is
//     frozen or cut off. [WithEventualNearCache] gives leases up, for
//     prefixes written often.
//
// Writes by other programs (redis-cli, a script) are dropped as soon as
// their invalidation arrives but are not waited for; nor are the values
// that loads and refreshes store. While a process cannot be sure it
// receives invalidations (a lost or silent connection, a reconnect, a
// change of masters, the circuit breaker open, its lease not renewed), it
// reads through Redis. Nothing is kept longer than its TTL nor than
// [WithNearMaxAge].
//
// Only values whose record carries its expiry are kept: the near cache
// turns on the freshness metadata that early refresh and stale serving use.
// Values due for early refresh and stale values are served through Redis,
// which starts their refresh as without a near cache.
//
// Each caller gets its own copy: decoded from the stored bytes (no network,
// but a decode per hit), or, when V (or *V) has a method Clone() V, a clone
// of the value decoded once, which is much cheaper than a decode;
// [WithNearShared] hands out one decoded value instead. Supported clients:
// *redis.Client (including a failover client), *redis.ClusterClient (a
// connection per master) and *redis.Ring (one per shard); on other
// UniversalClients the near cache is off. Requires Redis 6.0 or later
// (CLIENT TRACKING, and TIME, PUBLISH and INFO in scripts).
func WithNearCache(maxBytes int64) Option {
	return func(cfg *config) { cfg.near.set, cfg.near.off, cfg.near.maxBytes = true, false, maxBytes }
}

// WithoutNearCache turns the near cache off: every read goes to Redis, and
// the Cache keeps nothing in memory and holds no lease, so no writer waits
// for it. Its Delete and Set still wait for the near caches of the other
// processes of the prefix, as a near-cached Cache's do (one process may
// turn it off while the others keep it): on a prefix where none runs, that
// costs the registry's reply (in the write's own round trip on a single
// server, one more call on a cluster or a Ring); where some run, the first
// write opens a subscription for their acknowledgements, kept ten leases
// ([WithNearLease], whose value it assumes they share) after the last
// write. On a client the near cache does not support, writes wait for
// nothing.
func WithoutNearCache() Option {
	return func(cfg *config) { cfg.near.set, cfg.near.off = false, true }
}

// WithEventualNearCache keeps the near cache on but only eventually
// coherent, for prefixes written so often that waiting for every process
// costs too much. This process holds no coherence lease, so no write, from
// any process, waits for it; in exchange a read here may get a value that a
// write elsewhere replaced, until that write's invalidation arrives (a
// network hop: its lag is in BENCHMARKS.md) and never longer than maxAge
// after the value was read from Redis (it sets [WithNearMaxAge]). This
// process's own writes are seen at once by its own later reads.
//
// Its Set, Delete and Expire still wait, like every writer's, for the
// processes of the prefix that keep the default strict near cache, so that
// their promise holds whoever writes: where every process of the prefix
// uses this option there is nothing to wait for, and a write costs about
// what it costs without near caches. Default: off, the near cache is
// strictly coherent (see [WithNearCache]). maxAge must be positive; the
// byte budget stays [WithNearCache]'s.
func WithEventualNearCache(maxAge time.Duration) Option {
	return func(cfg *config) {
		cfg.near.off, cfg.near.eventual = false, true
		cfg.near.maxAge, cfg.near.maxAgeSet = maxAge, true
	}
}

// WithNearPerKey makes the strict near cache ([WithNearCache]) track per
// key, on a *redis.Client (a single server, or a failover client) or a
// *redis.ClusterClient: a write then waits only for the processes that
// hold its key in memory, each at most until its lease ends, and a write
// of a key nobody holds waits for nobody; without it every process of the
// prefix hears and acknowledges every write (BENCHMARKS.md: Redis CPU per
// write grows with the fleet). Each read from Redis that memory may keep
// first registers this process as a holder of the key (a small hash next
// to the key, expiring a minute after the last registration; sent again
// after 20s), and memory keeps no value longer than 39s ([WithNearMaxAge]
// is capped there).
// Writes of tag and Clear versions still wait for every process, as every
// process holds them.
//
// The limit (GUARANTEES.md): the holders of a key are known from that hash
// alone, so under an eviction policy (maxmemory-policy other than
// noeviction) Redis may evict it, and a write of the key then does not wait
// for the processes that hold it: they drop the old value when Redis's
// invalidation of the key reaches them, as an eventual near cache does; a
// Cache made on such a Redis logs a warning once.
// Processes of earlier versions, and a Ring's, track by prefix; while one
// holds a lease, every write waits for every process, as before. It has
// no effect on a Ring or with [WithEventualNearCache].
func WithNearPerKey() Option { return func(cfg *config) { cfg.near.perKey = true } }

// WithNearMaxAge bounds how long a value stays in the near cache after it
// was read from Redis, whatever its TTL: the longest an old value can be
// served if an invalidation is lost without its connection noticing.
// Default: 2s. It has no effect without the near cache.
func WithNearMaxAge(d time.Duration) Option {
	return func(cfg *config) { cfg.near.maxAge, cfg.near.maxAgeSet = d, true }
}

// WithNearLease sets the coherence lease of the near cache: how long a
// process may serve memory without proving it still receives invalidations,
// and so the longest a write waits for a process that stopped answering
// (frozen, partitioned, its connection killed). Renewed every quarter of it.
// Default: 1s. A Cache made WithoutNearCache uses it as the grace of a new
// or lost registry when it confirms its writes.
func WithNearLease(d time.Duration) Option {
	return func(cfg *config) { cfg.near.lease, cfg.near.leaseSet = d, true }
}

// WithNearShared makes near-cache hits return the one decoded value kept in
// memory, shared by every caller, instead of decoding a copy for each: the
// fastest path, for values that callers treat as read-only (a caller that
// modifies a map, slice or pointer in it changes what every other caller
// gets). It has no effect without the near cache.
func WithNearShared() Option {
	return func(cfg *config) { cfg.near.shared = true }
}

// WithObserver sends every [Event] to fn: hits, misses, loads, waits, lost
// locks, stale values served, refreshes, Redis errors and the circuit
// breaker. fn is called synchronously on the goroutine doing the work, on the
// hit path too, so it must be quick, must not block, and must be safe for
// concurrent use. Given more than once, every fn gets every event, in the
// order given (metrics and logs, say). Default: none (no cost).
//
// A panic in fn neither crashes the process (fn also runs on the cache's
// own goroutines: background refreshes, GetOrLoadMany's work) nor fails
// the call: it is recovered, passed to [WithErrorHook] as a [*PanicError]
// (its message says "observer panicked"), and the work goes on as if fn
// had returned. The other observers still get the event.
func WithObserver(fn func(Event)) Option {
	return func(cfg *config) {
		if prev := cfg.observer; prev != nil && fn != nil {
			cfg.observer = func(e Event) { defer fn(e); prev(e) } // deferred: fn gets e even if prev panics
			return
		}
		if fn != nil {
			cfg.observer = fn
		}
	}
}

// WithReplicaReads lets the reads of [Cache.GetOrLoad] and [Cache.Get]
// follow the Redis client's own routing: with a *redis.ClusterClient (or a
// failover cluster client) built with ReadOnly, RouteByLatency or
// RouteRandomly, hits are then served by replicas, one GET per read (no
// batching). Without it the cache reads from masters whatever the client's
// routing.
//
// The guarantee is weaker: a caller that begins after a [Cache.Delete] or
// [Cache.Set] returned may still get the old value (or miss a new one) for
// as long as the replica that serves it lags behind its master, which is
// usually milliseconds but has no bound (a replica that stops applying its
// master's stream serves its old copy until it resumes or is cut off;
// reliability/replica_test.go measures it). Misses, loads and writes go to
// masters as always, so a key is still loaded once. On a cluster client
// the Cache then has no near cache, as with [WithoutNearCache] (a
// replica's copy may be older than the invalidations the process has seen,
// and memory would keep it past the lag): it holds no lease for writers to
// wait for and opens no tracking connection, and its writes still wait for
// the others' near caches. Default: off. It changes nothing for a client
// that is not a cluster client.
func WithReplicaReads() Option { return func(cfg *config) { cfg.replicaReads = true } }

// WithTags lets values carry tags ([Tags], [AddTags]) and makes
// [Cache.DeleteByTag] and [Cache.Clear] work, with the promise of Delete: a
// read that begins after either returned, in any process, near caches
// included, gets no value they removed. Each costs O(1) Redis work however
// many values it removes: every record is stamped with the prefix's tag
// clock and its tags (a few bytes), and a read checks the stamp against the
// versions that DeleteByTag and Clear set, which a near cache keeps in
// memory under the same coherence as values (a near hit costs the same; a
// DeleteByTag drops the values with its tags from every process's memory,
// a Clear empties it). Without a near
// cache, each Redis hit reads the versions too: one more round trip.
//
// Set it in every process of the prefix: a process without it writes
// unstamped records, which a Clear removes and DeleteByTag cannot, and
// reads unstamped records without checking for Clear. A stamped value lives
// at most 30 days in Redis (the versions' memory), whatever its TTL; the
// versions and the prefix's tag clock are kept 30 days past the last
// DeleteByTag or Clear. [New] panics if the prefix's first '{' is closed at
// once ("a{}b:"): no two keys beginning with it share a slot.
func WithTags() Option { return func(cfg *config) { cfg.tags = true } }

// Per-call options: what one call changes for itself, leaving the
// Cache's options as they are for every other call.

// CallOption changes one call of [Cache.GetOrLoad], [Cache.GetOrLoadMany],
// [Cache.Get] or [Cache.Set]. Each option's doc says which calls it
// applies to; a call ignores the options that mean nothing to it (a TTL to
// Get, say). The simple call, with no option, is the Cache's behaviour.
//
// Callers of one key merged into one flight share its work: the options of
// the caller that started the flight decide it (its TTL, whether a stale
// value may be served), as its loader does. [ForceRefresh] is the
// exception: such a call never joins a flight.
type CallOption func(*callOptions)

// callOptions is what a call's options said; the zero value is the Cache's
// behaviour.
type callOptions struct {
	store    storeChoice // the TTL and tags of what the call stores
	force    bool        // load anew even if a value is cached
	noStale  bool        // a value past its TTL is a miss for this call
	skipNear bool        // read Redis even when the value is in memory
}

// TTL makes the value this call stores live for d (before jitter) instead
// of the Cache's TTL (see [WithTTL]): for [Cache.Set] the value it writes,
// for [Cache.GetOrLoad] and [Cache.GetOrLoadMany] the values their loader
// returns (a loader's own [SetTTL] still wins: it knows the value). A hit
// keeps the TTL it was stored with, and so does a refresh ([WithStale],
// [WithEarlyRefresh]): the value it loads is stored for the TTL of the one
// it replaces, whoever's call started it, unless that call or the loader
// chooses one. A d computed from data may have run out
// (TTL(time.Until(sale.Ends))): at or below zero, GetOrLoad and
// GetOrLoadMany return what they load without storing it, and Set removes
// the key as [Cache.Delete] does (a value already expired, which must not
// leave the older one in place); a d under 1ms is 1ms, Redis's
// resolution.
func TTL(d time.Duration) CallOption {
	return func(o *callOptions) { o.store.ttl = ttlChoice{d, true} }
}

// Tags gives the values this call stores the tags given, for
// [Cache.DeleteByTag]: the value [Cache.Set] writes, the values the loader
// of [Cache.GetOrLoad] or [Cache.GetOrLoadMany] returns (the loader may add
// more with [AddTags]); a refreshed value keeps its tags. A value found
// without one of them (stored by a call with other tags, in any process) is
// a miss for GetOrLoad and GetOrLoadMany: it is loaded again, under the
// load lock, and stored with its old tags and these, so that a
// DeleteByTag of them removes what the call returned; [Cache.Get] ignores
// them. Callers of one key that agree on its tags pay no such reload. The
// Cache must be made [WithTags] (else the call returns [ErrNoTags]); an
// empty tag is an error.
func Tags(tags ...string) CallOption {
	return func(o *callOptions) { o.store.tags = append(o.store.tags, tags...) }
}

// ForceRefresh makes [Cache.GetOrLoad] load the key anew even if a value is
// cached, and store what it loads: after a change to the source that did
// not go through [Cache.Set], say. It still takes the key's load lock, so
// that callers forcing the same key in any number of processes load it
// once: a caller that finds the lock held waits for that load and returns
// its value, which began after the value it found. It never joins an
// in-process flight that began before it. [Cache.GetOrLoadMany] loads
// every key anew the same way; Get and Set ignore it.
func ForceRefresh() CallOption { return func(o *callOptions) { o.force = true } }

// NoStale makes one call treat a value past its TTL as missing even under
// [WithStale]: [Cache.GetOrLoad] loads it (under the load lock, as a miss)
// instead of serving it, and [Cache.Get] returns [ErrCacheMiss]. For a
// caller that needs a value within its TTL, such as a read before a
// write. [Cache.GetOrLoadMany] treats such values as misses too; Set
// ignores it. Such a call never gets a stale value, whichever caller's
// flight answered it, nor the fallback of a value [Cache.Expire] expired:
// a failed load is its error.
func NoStale() CallOption { return func(o *callOptions) { o.noStale = true } }

// parseCall applies opts to the Cache's behaviour.
func parseCall(opts []CallOption) callOptions {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// SkipNear makes one call of [Cache.Get] or [Cache.GetOrLoad] read Redis
// even when the value is in this process's near cache: for a read that
// wants the shared copy (after a payment, say), as go-redis/cache's
// SkipLocalCache. The near cache's promise makes it rarely needed: a value
// in memory is never older than a write that returned before the read
// began. What the call reads is kept in memory as any read. GetOrLoadMany
// and Set ignore it.
func SkipNear() CallOption { return func(o *callOptions) { o.skipNear = true } }
