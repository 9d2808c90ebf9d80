// loader.go is the Cache and its read-through path, GetOrLoad: merge, read,
// read-or-lock, wait, load, fenced commit.

package cache

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"golang.org/x/sync/singleflight"
)

var (
	//go:embed scripts/read_or_lock.lua
	readOrLockLua    string
	readOrLockScript = redis.NewScript(readOrLockLua)

	//go:embed scripts/commit.lua
	commitLua    string
	commitScript = redis.NewScript(commitLua)
)

// Cache is a Redis read-through cache of values of type V that loads each
// missing key once across all the processes that share the Redis. It is safe
// for concurrent use; create one per value type and reuse it.
type Cache[V any] struct {
	rdb      redis.UniversalClient
	cfg      config
	cluster  bool               // rdb is a *redis.ClusterClient: Delete sends single-key commands
	deadline sharedDeadline     // bounds the GETs of flights
	group    singleflight.Group // merges this process's callers of one key
	calls    sync.Pool          // *flightCall[V]: a caller's request to group
	reads    *coalescer         // sends concurrent flights' GETs together
	share    *share             // what the Caches on rdb share (see shared.go)
	brk      *breaker           // share's
	notify   *notifier          // share's: wakes waiters; nil: they poll
	near     *near[V]           // values kept in memory; nil: off (see WithNearCache)
	registry string             // the near caches' lease registry: a reserved key
	markKeys string             // what writers' marker keys begin with: reserved

	refreshing sync.Map       // keys with a background refresh running in this process
	bg         sync.WaitGroup // background refreshes, waited for by Close
	bgMu       sync.Mutex     // orders starting a refresh and Close's wait
	closed     bool           // Close was called; guarded by bgMu
}

// New returns a Cache on rdb, which may be a *redis.Client, *redis.ClusterClient,
// *redis.Ring or failover client. Invalid options panic, naming the option:
// they are programming errors, found at start-up. So does a second value
// type on one prefix: New panics if a Cache of another V is open on the same
// client with the same non-empty prefix (the two would overwrite each
// other's values); a closed Cache frees its prefix. Without a prefix, caches
// of any types share the keyspace, and a record one of them cannot decode is
// reported as [EventDecodeError].
//
// Every Cache on the same client (the same pointer) shares one set of
// resources: one subscription per Redis master for its waiters, one circuit
// breaker per breaker setting (see [WithCircuitBreaker]) and what is known
// of Redis's health, so that N caches on one client cost one subscribed
// connection per master and learn of an outage together. The last of them
// to be closed (see [Cache.Close]) releases them.
func New[V any](rdb redis.UniversalClient, opts ...Option) *Cache[V] {
	if rdb == nil {
		panic("cache: New: nil Redis client")
	}
	c := &Cache[V]{rdb: rdb, cfg: newConfig(opts)}
	c.registry, c.markKeys = leaseKey(c.cfg.prefix), markKeyPrefix(c.cfg.prefix)
	_, c.cluster = rdb.(*redis.ClusterClient)
	c.share = acquire(rdb, &c.cfg, reflect.TypeFor[V]())
	c.brk, c.notify = c.share.brk, c.share.notify
	// A Cache dropped without Close gives its hold back when collected.
	runtime.AddCleanup(c, func(s *share) { go s.release() }, c.share)
	c.reads = newCoalescer(rdb, func() context.Context { return c.deadline.within(context.Background(), c.cfg.loadTimeout, time.Now()) }, c.cfg.replicaReads)
	if c.cfg.near.on() && nearSupported(rdb) {
		c.near = newNear(c)
		runtime.AddCleanup(c, func(n *near[V]) { go n.close() }, c.near) // its connections and goroutines, too
	}
	return c
}

// result is what one flight hands to all of its callers.
type result[V any] struct {
	data      []byte           // the codec's bytes; each caller decodes its own copy
	notFound  error            // non-nil: the value does not exist; what callers get
	err       error            // non-nil: the codec panicked reading the record; what callers get
	v         V                // on a hit, data already decoded once...
	hasV      bool             // ...for the first caller to take
	taken     atomic.Bool      // whether v has been handed out
	fresh     record.Freshness // what the record says of its age (zero: nothing)
	head      []byte           // the record up to the payload: which write it is
	throttled bool             // a stale value kept after a failed refresh
	stale     bool             // served past its TTL
	// at is when the Redis call that vouches for this result was sent: the
	// read that found it, the commit that stored it, or for a load whose lock
	// was lost, the lock's acquisition. A caller that began after at may
	// have begun after a Delete in another process removed it, so it asks
	// again rather than take it.
	at time.Time
}

// GetOrLoad returns the value at key. On a miss it takes the key's load lock,
// calls load, stores the value for the TTL and returns it; callers in other
// processes wait for that value instead of calling load themselves.
//
// Callers of the same key in this process are merged into one flight (one
// Redis read, at most one load); the first caller's load function and context
// values are used for it. The flight runs on a context detached from the
// callers' cancellation and bounded by [WithLoadTimeout]; load receives that
// context. Each caller stops waiting when its own ctx ends and returns
// ctx.Err(), without disturbing the flight. A caller never gets a value that
// a [Cache.Delete] which returned before the caller began has removed, in
// any process: a flight older than the caller is asked again.
//
// opts change this call only (see [CallOption]): [TTL], [ForceRefresh],
// [NoStale]. A ctx already ended when GetOrLoad is called returns ctx.Err()
// at once, without a Redis call or a load.
//
// Every caller gets its own decoded copy of the value. Errors: [ErrEmptyKey],
// [ErrReservedKey], [ErrNilLoader]; an error wrapping [ErrNotFound] and
// naming the key when load (now or within the not-found TTL) returned it,
// the same on every call (see [ErrNotFound]); load's own error unchanged (a panic in load
// becomes a [*PanicError]); an error wrapping [ErrLockNotAcquired], naming
// the key, when the retry budget ran out while another process was loading;
// an error wrapping context.DeadlineExceeded when the load timeout ended the
// wait, the loader or a Redis call; a Redis error under [FailClosed] (or
// [ErrCircuitOpen] while the breaker is open), and under every policy a
// Redis reply that means misconfiguration (NOAUTH, WRONGPASS, NOPERM, an
// unknown command); an encoding error when the codec cannot encode the
// loaded value (nothing is cached). Errors the cache absorbs instead of
// returning go to [WithErrorHook].
func (c *Cache[V]) GetOrLoad(ctx context.Context, key string, load func(ctx context.Context) (V, error), opts ...CallOption) (V, error) {
	var zero V
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return zero, err
	}
	ctx, o := withCall(ctx, opts)
	if !o.force && !o.noStale {
		if v, ok := c.nearGet(key); ok && load != nil {
			return v, nil
		}
	}
	key, err := c.key(key)
	if err != nil {
		return zero, err
	}
	if load == nil {
		return zero, ErrNilLoader
	}
	tk := c.nearTicket(key) // before start: every read this caller takes is sent after it
	start := time.Now()
	for {
		var v any
		var err error
		if o.force {
			v, err = c.forced(ctx, key, load)
		} else {
			v, err = c.merged(ctx, key, load)
		}
		if err != nil {
			return zero, err
		}
		res := v.(*result[V])
		if res.at.Before(start) {
			// The flight's answer predates this caller. The flight has left
			// the group, so the next one starts after start.
			continue
		}
		if res.stale {
			markStale(ctx)
		}
		if c.near != nil {
			c.near.keep(c, key, tk, res)
		}
		if res.notFound != nil && res.err == nil {
			return zero, notFound(key)
		}
		return c.value(res)
	}
}

// forced runs a flight of its own for a [ForceRefresh] caller, never
// merged with one that began before it, and returns its outcome, or
// ctx.Err() as soon as ctx ends (the flight goes on, bounded by the load
// timeout, and ends the goroutine when it is done).
func (c *Cache[V]) forced(ctx context.Context, key string, load func(context.Context) (V, error)) (any, error) {
	done := make(chan outcome, 1)
	go func() {
		r, err := c.flight(ctx, key, load)
		done <- outcome{r, err}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// flight is the shared work of one key's merged callers. It runs on ctx's
// values without its cancellation: the GET on a deadline the Cache shares
// among its flights (no timer of its own for a hit), the miss path on a
// deadline of its own, both within the load timeout.
func (c *Cache[V]) flight(ctx context.Context, key string, load func(context.Context) (V, error)) (r *result[V], err error) {
	defer func() { // a panic decoding a hit: an error for the callers, not a crash
		if p := recover(); p != nil {
			err = &PanicError{in: "flight", Value: p, stack: debug.Stack()}
		}
	}()
	at := time.Now() // one clock read for both: before the GET is sent, as at must be
	return c.fetch(c.deadline.within(ctx, c.cfg.loadTimeout, at), key, load, at)
}

// sharedDeadline hands flights a context that ends between 3/4 of the
// timeout and the timeout after they start, renewed every quarter timeout:
// one timer per quarter instead of one per flight. (go-redis's own
// timeouts do not bound everything: a new connection's handshake can wait
// on the context alone.) It is safe for concurrent use.
type sharedDeadline struct{ cur atomic.Pointer[deadlineCtx] }

type deadlineCtx struct {
	context.Context
	cancel  context.CancelFunc // never called: the context ends at its deadline
	renewAt int64              // nanotime after which flights get a newer one
}

// within returns a context with ctx's values, without its cancellation,
// that ends within timeout.
func (d *sharedDeadline) within(ctx context.Context, timeout time.Duration, at time.Time) context.Context {
	now := int64(at.Sub(epoch))
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

// value hands a flight's result to one caller.
func (c *Cache[V]) value(r *result[V]) (V, error) {
	if r.notFound != nil || r.err != nil {
		var zero V
		if r.err != nil {
			return zero, r.err
		}
		return zero, r.notFound
	}
	if r.hasV && !r.taken.Swap(true) {
		return r.v, nil
	}
	return c.decodeCopy(r.data)
}

// decodeCopy decodes a caller's own copy (its v escapes to the codec; kept
// out of value so that a caller handed the decoded value allocates none).
// A panicking codec is an error: this runs on callers' goroutines and on
// the library's own.
func (c *Cache[V]) decodeCopy(data []byte) (V, error) {
	var v V
	if err := c.unmarshal(data, &v); err != nil {
		var zero V
		return zero, err
	}
	return v, nil
}

// unmarshal decodes data into v, turning a codec panic into a
// [*PanicError] (an error the codec returned is wrapped as "decode value").
func (c *Cache[V]) unmarshal(data []byte, v *V) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{in: "codec", Value: p, stack: debug.Stack()}
		}
	}()
	if err := c.cfg.codec.Unmarshal(data, v); err != nil {
		return fmt.Errorf("cache: decode value: %w", err)
	}
	return nil
}

// Delete removes the values at keys and their load locks. A load in flight
// for one of them when Delete runs, in any process, finds its lock gone and
// writes nothing, and no GetOrLoad that begins after Delete returns gets the
// removed value or that load's. Keys may be in different cluster slots; on a
// cluster, Delete sends single-key commands (each lock before its value), so
// it also succeeds while a slot migrates. Transient cluster errors are
// retried within the retry budget. A ctx already ended returns ctx.Err()
// at once, deleting nothing. Errors: [ErrEmptyKey], [ErrReservedKey],
// or a Redis error wrapped as "cache: redis: ...".
func (c *Cache[V]) Delete(ctx context.Context, keys ...string) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	full := make([]string, len(keys))
	for i, k := range keys {
		k, err := c.key(k)
		if err != nil {
			return err
		}
		full[i] = k
	}
	defer func() {
		c.nearDrop(full...)
		for _, k := range full {
			c.group.Forget(k) // later callers must not join a flight that began before the delete
		}
	}()
	return c.writeConfirmed(ctx, full, c.classify,
		func(p redis.Pipeliner) { delCmds(ctx, p, full) },
		func() error { return c.del(ctx, full) })
}

// del removes keys and their locks: on a cluster with single-key commands,
// locks first, so that a holder cannot commit between the two; elsewhere
// with one DEL per key, which a redis.Ring routes by the value key, where
// the lock lives.
func (c *Cache[V]) del(ctx context.Context, keys []string) error {
	pipe := func(fn func(p redis.Pipeliner)) error {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error { fn(p); return nil })
		return err
	}
	if c.cluster {
		if err := pipe(func(p redis.Pipeliner) {
			for _, k := range keys {
				p.Del(ctx, LockKey(k))
			}
		}); err != nil {
			return err
		}
		return pipe(func(p redis.Pipeliner) {
			for _, k := range keys {
				p.Del(ctx, k)
			}
		})
	}
	return pipe(func(p redis.Pipeliner) { delCmds(ctx, p, keys) })
}

// delCmds deletes keys with their locks, one DEL per key (which a Ring
// routes by the value key, where the lock lives).
func delCmds(ctx context.Context, p redis.Pipeliner, keys []string) {
	for _, k := range keys {
		p.Del(ctx, k, LockKey(k))
	}
}

// key checks a caller's key and returns it with the prefix.
func (c *Cache[V]) key(k string) (string, error) {
	if k == "" {
		return "", ErrEmptyKey
	}
	k = c.cfg.prefix + k
	if isLockName(k) || k == c.registry || strings.HasPrefix(k, c.markKeys) {
		return "", fmt.Errorf("%w: %q", ErrReservedKey, k)
	}
	return k, nil
}

// redisCall records a Redis call's outcome with the breaker and the
// observer, and classifies its error.
func (c *Cache[V]) redisCall(key string, err error) errClass {
	if errors.Is(err, ErrLoadLockLost) { // a reply (the lock was not ours), not an outage
		err = nil
	}
	class := c.classify(err)
	switch c.brk.record(class, err) {
	case +1:
		c.cfg.emit(EventBreakerOpen, key, 0, err)
	case -1:
		c.cfg.emit(EventBreakerClose, key, 0, nil)
	}
	if class != errNone {
		c.cfg.emit(EventRedisError, key, 0, err)
	}
	return class
}

// fetch is one flight: read, then read-or-lock until a value or the lock.
// at is a moment before the read is sent.
func (c *Cache[V]) fetch(ctx context.Context, key string, load func(context.Context) (V, error), at time.Time) (*result[V], error) {
	if !c.brk.allow() {
		return c.redisFailed(ctx, key, c.brk.err(), load)
	}
	b, err := c.reads.get(ctx, key)
	var skip []byte // bytes at key we could not decode, or must reload: a miss, to be replaced
	switch class := c.redisCall(key, err); {
	case err == nil:
		if callOf(ctx).force { // what is there now is to be replaced; a value committed after it is not
			skip = b
			break
		}
		if r := c.found(ctx, key, load, c.decode(key, b, at)); r != nil {
			return r, nil
		}
		skip = b
	case errors.Is(err, redis.Nil), isWrongType(err), class == errTransient:
	case class == errFatal:
		return nil, fmt.Errorf("cache: redis: %w", err)
	default:
		return c.redisFailed(ctx, key, err, load)
	}
	c.cfg.emit(EventMiss, key, 0, nil)
	// The miss path's own deadline, a whole load timeout from here: the
	// shared one of the GET may be nearly spent.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.loadTimeout)
	defer cancel()

	lk := newLoadLock(key)
	var waitStart time.Time
	var transient error // the last transient reply, named if the timeout ends its wait
	var subscribed bool // a wait has returned early to re-read after subscribing
	for attempt := 1; ; attempt++ {
		at := time.Now()
		res, err := readOrLockScript.Run(ctx, c.rdb, lk.keys(), lk.token, c.cfg.lockTTL.Milliseconds(), skip).Slice()
		switch c.redisCall(key, err) {
		case errNone:
			if res[0].(int64) == 1 {
				b := []byte(res[1].(string))
				if r := c.found(ctx, key, load, c.decode(key, b, at)); r != nil {
					c.waited(key, waitStart, nil)
					return r, nil
				}
				skip = b
			} else if res[1].(int64) == 1 {
				c.waited(key, waitStart, nil)
				return c.load(ctx, key, lk, at, load, nil)
			} else if waitStart.IsZero() {
				waitStart = time.Now()
				c.cfg.emit(EventLockContended, key, 0, nil)
			}
		case errTransient: // a slot migrating, a failover: wait it out like a held lock
			transient = err
			if !c.cfg.retry.wait(ctx, attempt) { // no longer transient: say what it was
				return nil, fmt.Errorf("cache: redis: still failing after %d retries: %w", attempt-1, err)
			}
			continue
		case errFatal:
			return nil, fmt.Errorf("cache: redis: %w", err)
		case errFull: // OOM refused the lock's SET, which is the script's first write: nothing to release
			return c.redisFailed(ctx, key, err, load)
		default:
			// The lock is ours if only the reply was lost. Release it in the
			// background: on a stalled Redis a second round trip would double
			// the wait before the failure policy applies. The goroutine ends
			// with the release, which is bounded like every commit and release.
			go c.release(ctx, key, lk, at)
			if transient != nil && ctx.Err() != nil { // the load timeout ended a transient wait: name both
				return nil, fmt.Errorf("cache: redis: still failing when the load timeout ended: %w (before it: %w)", err, transient)
			}
			return c.redisFailed(ctx, key, err, load)
		}
		if attempt <= c.cfg.retry.max {
			began := time.Now()
			if c.notify.wait(ctx, key, c.cfg.retry.backoff) {
				c.cfg.emit(EventWoken, key, 0, nil)
			} else if !subscribed && time.Since(began) < c.cfg.retry.backoff/2 && ctx.Err() == nil {
				attempt--         // the wait only subscribed, so that the next read misses no commit: not a retry
				subscribed = true // once: any other early return counts, so a flight can never spin
			}
		}
		if attempt > c.cfg.retry.max || ctx.Err() != nil {
			err := c.notAcquired(ctx, key)
			c.waited(key, waitStart, err)
			return nil, err
		}
	}
}

// waited reports the end of a wait for another holder, if there was one.
func (c *Cache[V]) waited(key string, start time.Time, err error) {
	if !start.IsZero() {
		c.cfg.emit(EventWait, key, time.Since(start), err)
	}
}

// notAcquired is the error of a waiter whose budget ran out.
func (c *Cache[V]) notAcquired(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: waited for another process to load %q until the load timeout (%v): %w",
			ErrLockNotAcquired, key, c.cfg.loadTimeout, err)
	}
	return fmt.Errorf("%w: %q was still being loaded by another process after %d retries %v apart",
		ErrLockNotAcquired, key, c.cfg.retry.max, c.cfg.retry.backoff)
}

// decode reads the record found at key at time at; nil means it is not one
// this version can read. A value the codec cannot decode (another Cache's
// value type, say) is a miss too, sent to the observer as
// EventDecodeError and to the error hook once per key (see decodeReports).
func (c *Cache[V]) decode(key string, b []byte, at time.Time) *result[V] {
	flags, payload, err := record.Decode(b)
	if err != nil {
		return nil
	}
	if flags&record.FlagNotFound != 0 {
		return &result[V]{notFound: ErrNotFound, at: at}
	}
	r := &result[V]{data: payload, hasV: true, at: at}
	if err := c.unmarshal(payload, &r.v); err != nil {
		var pe *PanicError
		if !errors.As(err, &pe) {
			c.cfg.emit(EventDecodeError, key, 0, err)
			if c.cfg.onError != nil && c.share.decodes.first(key) {
				c.cfg.onError(key, err)
			}
			return nil // bytes this codec cannot read: a miss, to be replaced
		}
		return &result[V]{err: err, at: at} // a broken codec: reloading would not help
	}
	r.fresh, _ = record.ReadFreshness(b)
	r.throttled = b[1]&flagThrottled != 0
	r.head = b[:len(b)-len(payload)]
	return r
}

// found answers a flight with a record it read (nil: unreadable): fresh
// values at once, values due for refresh after starting it in the
// background, stale ones as stale serving says. nil means a miss.
func (c *Cache[V]) found(ctx context.Context, key string, load func(context.Context) (V, error), r *result[V]) *result[V] {
	if r == nil {
		return nil
	}
	if r.err != nil {
		return r
	}
	switch c.cfg.ageOf(r.fresh, r.throttled, r.at, r.head) { // r.at is a moment ago: no clock read on a hit
	case ageFresh:
	case ageRefresh:
		c.refresh(ctx, key, load, r)
	case ageStale: // a value kept after a failed refresh is retried once its throttle ends
		if callOf(ctx).noStale {
			return nil // a miss for this flight: reloaded under the lock
		}
		return c.serveStale(ctx, key, load, r, r.throttled && r.at.Before(r.fresh.Expiry))
	default:
		return nil
	}
	c.cfg.emit(EventHit, key, 0, nil)
	return r
}

// load runs the loader as the lock holder (the lock taken by the call sent
// at locked), with the watchdog extending the lease, and commits the outcome.
// When the loader fails and stale is the payload of a stale value (a
// refresh under [WithStale]), that value is kept for the throttle instead.
func (c *Cache[V]) load(ctx context.Context, key string, lk *loadLock, locked time.Time, load func(context.Context) (V, error), stale []byte) (*result[V], error) {
	stop := c.watchdog(ctx, key, lk)
	began := time.Now()
	opts := newLoadOptions(ctx)
	v, err := callLoader(context.WithValue(ctx, loadOptionsKey{}, opts), load)
	took := time.Since(began)
	c.cfg.emit(EventLoad, key, took, err)
	stop()
	r, err := c.outcome(key, v, err)
	switch {
	case err != nil && stale != nil:
		c.report(key, fmt.Errorf("cache: refresh of %q failed; its stale value is served for %v more: %w", key, c.cfg.throttle, err))
		rec := record.EncodeFresh(flagThrottled, record.Freshness{Expiry: time.Now().Add(c.cfg.throttle), Load: took}, stale)
		c.commit(ctx, key, lk, locked, rec, addSat(c.cfg.throttle, c.cfg.stale))
	case err != nil:
		c.release(ctx, key, lk, locked)
	case opts.noCache, r.notFound != nil && c.cfg.notFoundTTL == 0:
		r.at = c.release(ctx, key, lk, locked) // callers merged with the load get it (see DoNotCache)
	case r.notFound != nil:
		r.at = c.commit(ctx, key, lk, locked, record.Encode(record.FlagNotFound, nil), c.cfg.notFoundTTL)
	default:
		ttl := c.cfg.ttl
		if opts.ttl > 0 {
			ttl = opts.ttl
		}
		record, px := c.record(r.data, took, ttl)
		r.at = c.commit(ctx, key, lk, locked, record, px)
	}
	return r, err
}

// record wraps a value loaded in took for a TTL of ttl (before jitter); px
// is how long Redis keeps it: the TTL plus what stale serving and early
// refresh need past it.
func (c *Cache[V]) record(data []byte, took, ttl time.Duration) (rec []byte, px time.Duration) {
	ttl = c.jittered(ttl)
	if !c.cfg.withFreshness() {
		return record.Encode(0, data), ttl
	}
	return record.EncodeFresh(0, record.Freshness{Expiry: time.Now().Add(ttl), Load: took}, data), addSat(ttl, c.cfg.keep(took))
}

// outcome turns what the loader returned into a flight result. On success
// every caller, the first included, decodes the encoded bytes, so that all
// see exactly what the cache stores.
func (c *Cache[V]) outcome(key string, v V, err error) (*result[V], error) {
	var pe *PanicError
	switch {
	case errors.As(err, &pe): // even a panic with ErrNotFound is a failure
		return nil, err
	case errors.Is(err, ErrNotFound): // the loader's wrapping is not kept: a cached read could not give it back
		return &result[V]{notFound: ErrNotFound}, nil
	case err != nil:
		return nil, err
	}
	data, err := c.marshal(v)
	if err != nil {
		return nil, fmt.Errorf("cache: encode value for %q: %w", key, err)
	}
	return &result[V]{data: data}, nil
}

// marshal encodes v; a panicking codec becomes an error here, while the lock
// is still held, so that the lock is released.
func (c *Cache[V]) marshal(v V) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{in: "codec", Value: p, stack: debug.Stack()}
		}
	}()
	return c.cfg.codec.Marshal(v)
}

// cleanup gives commit and release a context that outlives the flight's
// deadline, bounded by the lease: an abandoned lock would block every
// process for a whole lease.
func (c *Cache[V]) cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.cfg.lockTTL)
}

// commit writes record if the lock is still ours, retrying transient cluster
// errors within the lease. The loaded value is returned to the callers
// either way: it is what the source said, only a newer writer (or a Delete)
// keeps it out of Redis. It returns the time that vouches for the value:
// the commit's when stored, else the lock's acquisition (locked).
func (c *Cache[V]) commit(ctx context.Context, key string, lk *loadLock, locked time.Time, record []byte, ttl time.Duration) time.Time {
	ctx, cancel := c.cleanup(ctx)
	defer cancel()
	for attempt := 1; ; attempt++ {
		at := time.Now()
		n, err := commitScript.Run(ctx, c.rdb, lk.keys(), lk.token, record, ttl.Milliseconds(), c.notify.channel(key)).Int()
		class := c.redisCall(key, err)
		switch {
		case class == errTransient && c.cfg.retry.wait(ctx, attempt):
			continue
		case err != nil:
			c.report(key, fmt.Errorf("cache: store %q: %w", key, err))
		case n == 0:
			c.cfg.emit(EventLockLost, key, 0, ErrLoadLockLost)
			c.report(key, fmt.Errorf("cache: loaded value for %q not stored, the lock was lost: %w", key, ErrLoadLockLost))
		default:
			return at
		}
		return locked
	}
}

// release gives the lock up; if it is no longer ours there is nothing to do.
// Like commit, it returns the time that vouches for what the holder loaded:
// the release's when the lock was still ours (no Delete or Set came
// between), else locked.
func (c *Cache[V]) release(ctx context.Context, key string, lk *loadLock, locked time.Time) time.Time {
	ctx, cancel := c.cleanup(ctx)
	defer cancel()
	for attempt := 1; ; attempt++ {
		at := time.Now()
		err := lk.release(ctx, c.rdb, c.notify.channel(key))
		if c.redisCall(key, err) == errTransient && c.cfg.retry.wait(ctx, attempt) {
			continue
		}
		if err == nil {
			return at
		}
		if !errors.Is(err, ErrLoadLockLost) {
			c.report(key, fmt.Errorf("cache: release lock of %q: %w", key, err))
		}
		return locked
	}
}

// report hands an absorbed error to the error hook. Redis refusing writes
// for want of memory is told once per episode (see health.full), named as
// such: it is a sizing problem for the operator, not one per key.
func (c *Cache[V]) report(key string, err error) {
	if c.classify(err) == errFull {
		ep := c.share.res.health.episode.Load()
		if c.share.fullSeen.Swap(ep) == ep {
			return
		}
		err = fmt.Errorf("cache: redis is out of memory (maxmemory): values are not being stored: %w", err)
	}
	if c.cfg.onError != nil {
		c.cfg.onError(key, err)
	}
}

// watchdog extends lk every lockTTL/3 until the returned stop is called or
// the lock turns out to be lost. stop waits for the goroutine to end.
func (c *Cache[V]) watchdog(ctx context.Context, key string, lk *loadLock) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.cfg.lockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				err := lk.extend(ctx, c.rdb, c.cfg.lockTTL)
				if errors.Is(err, ErrLoadLockLost) {
					return
				}
				c.redisCall(key, err)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// redisFailed applies the failure policy to a Redis outage, or to Redis
// refusing the lock for want of memory (OOM), which FailOpen meets as it
// meets an outage: one load per key per process at a time, uncached.
func (c *Cache[V]) redisFailed(ctx context.Context, key string, err error, load func(context.Context) (V, error)) (*result[V], error) {
	if !errors.Is(err, ErrCircuitOpen) {
		err = fmt.Errorf("cache: redis: %w", err)
	}
	if ctx.Err() != nil || c.cfg.policy == FailClosed {
		return nil, err
	}
	if !errors.Is(err, ErrCircuitOpen) { // an open breaker is reported once, as EventBreakerOpen
		c.report(key, err)
	}
	began := time.Now()
	v, err := callLoader(context.WithValue(ctx, loadOptionsKey{}, newLoadOptions(ctx)), load) // SetTTL works, though nothing is stored
	c.cfg.emit(EventLoad, key, time.Since(began), err)
	r, err := c.outcome(key, v, err)
	if r != nil {
		r.at = began // read from the source after this: a caller that joined later asks again
	}
	return r, err
}

// addSat is a+b, saturating instead of overflowing for huge TTLs.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// jittered spreads d by the configured fraction, to at least 1ms and without
// overflowing for huge TTLs.
func (c *Cache[V]) jittered(d time.Duration) time.Duration {
	delta := time.Duration(c.cfg.jitter * (2*rand.Float64() - 1) * float64(d))
	if delta > 0 && d > math.MaxInt64-delta {
		return math.MaxInt64
	}
	return max(d+delta, time.Millisecond)
}
