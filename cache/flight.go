// This file is GetOrLoad's flight, the first half of the miss path: merge,
// read, read-or-lock, wait; loadFor loads and commits.

package cache

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/lockkey"
	"github.com/stampede-go/stampede/internal/record"
)

var (
	//go:embed scripts/read_or_lock.lua
	readOrLockLua    string
	readOrLockScript = redis.NewScript(readOrLockLua)
)

// getOrLoad is GetOrLoad with its options read.
func (c *Cache[V]) getOrLoad(ctx context.Context, key string, load func(ctx context.Context) (V, error), o callOptions) (V, error) {
	var zero V
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return zero, err
	}
	if err := c.checkTags(o.store.tags); err != nil { // on a near hit too: the call is wrong whatever memory holds
		return zero, err
	}
	if load != nil && !o.force && !o.noStale && !o.skipNear {
		if v, ok := c.nearGet(key, o.store.tags); ok {
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
	tk := c.nearTicket(key) // before the flight's start: every read this caller takes is sent after it
	res, err := c.answerFor(ctx, key, load, o)
	if err != nil {
		return zero, err
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

// answerFor returns the answer of the first flight of key that began after
// this caller did and that its options accept: the one it merges with, or
// one of its own.
func (c *Cache[V]) answerFor(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions) (*result[V], error) {
	start := time.Now()
	own := o.force // a flight of this caller's own, merged with no other
	for {
		var v any
		var err error
		if own {
			v, err = c.runOwnFlight(ctx, key, load, o)
		} else {
			v, err = c.merged(ctx, key, load, o)
		}
		if err != nil {
			return nil, err
		}
		res := v.(*result[V])
		switch {
		case res.at.Before(start):
			// The flight's answer predates this caller. The flight has left
			// the group, so the next one starts after start.
		case !own && !accepts(res, o):
			// Another caller's flight, whose options allowed what this
			// caller's refuse: ask again with a flight of its own.
			own = true
		default:
			return res, nil
		}
	}
}

// runOwnFlight runs a flight of its own for a [ForceRefresh] caller, never
// merged with one that began before it, and returns its outcome, or
// ctx.Err() as soon as ctx ends (the flight goes on, bounded by the load
// timeout, and ends the goroutine when it is done).
func (c *Cache[V]) runOwnFlight(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions) (any, error) {
	done := make(chan outcome, 1)
	go func() {
		r, err := c.flight(ctx, key, load, o)
		done <- outcome{r, err}
	}()
	select {
	case out := <-done:
		return out.v, out.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// flight is the shared work of one key's merged callers. It runs on ctx's
// values without its cancellation: the GET on a deadline the Cache shares
// among its flights (no timer of its own for a hit), the miss path on a
// deadline of its own, both within the load timeout.
func (c *Cache[V]) flight(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions) (r *result[V], err error) {
	defer func() { // a panic decoding a hit: an error for the callers, not a crash
		if p := recover(); p != nil {
			err = &PanicError{in: "flight", Value: p, stack: debug.Stack()}
		}
	}()
	at := time.Now() // one clock read for both: before the GET is sent, as at must be
	return c.fetch(c.deadline.Within(ctx, c.cfg.loadTimeout, at), key, load, o, at)
}

// value hands a flight's result to one caller.
func (c *Cache[V]) value(r *result[V]) (V, error) {
	if r.notFound != nil || r.err != nil {
		var zero V
		if r.err != nil {
			return zero, r.err
		}
		return zero, r.notFound
	}
	if r.unencoded || r.hasV && !r.taken.Swap(true) {
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

// key checks a caller's key and returns it with the prefix.
func (c *Cache[V]) key(k string) (string, error) {
	if k == "" {
		return "", ErrEmptyKey
	}
	k = c.cfg.prefix + k
	if lockkey.Is(k) || coherence.IsRegistry(k) || coherence.IsHoldRegistry(k) || coherence.IsHolders(k) || k == c.legacy || strings.HasPrefix(k, c.markKeys) || c.tags.Global(k) {
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
	c.brk.Record(key, class, err)
	if class != errNone {
		c.cfg.emit(EventRedisError, key, 0, err)
	}
	return class
}

// report hands an absorbed error to the error hook. Redis refusing writes
// for want of memory is told once per episode (see health.State), named as
// such: it is a sizing problem for the operator, not one per key.
func (c *Cache[V]) report(key string, err error) {
	if c.classify(err) == errFull {
		ep := c.share.res.health.Episode()
		if c.share.fullSeen.Swap(ep) == ep {
			return
		}
		err = fmt.Errorf("cache: redis is out of memory (maxmemory): values are not being stored: %w", err)
	}
	if c.cfg.onError != nil {
		c.cfg.onError(key, err)
	}
}

// fetch is one flight: read, then read-or-lock until a value or the lock.
// at is a moment before the read is sent.
func (c *Cache[V]) fetch(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions, at time.Time) (*result[V], error) {
	if !c.brk.Allow() {
		return c.redisFailed(ctx, key, c.brk.Err(), load, o)
	}
	b, current, tracked, err := c.read(ctx, key, false)
	var miss verdict[V] // what the miss path reloads
	var skip []byte     // bytes at key we could not decode, or must reload: a miss, to be replaced
	switch c.readReply(key, err) {
	case readHit:
		skip = b
		if o.force { // what is there now is to be replaced; a value committed after it is not
			break
		}
		miss = c.judge(key, markTracked(c.decodeFor(key, b, at, current), tracked), o, true)
		if r := c.answerVerdict(ctx, key, load, o, miss); r != nil {
			return r, nil
		}
	case readMiss:
	case readFatal:
		return nil, fmt.Errorf("cache: redis: %w", err)
	default:
		return c.redisFailed(ctx, key, err, load, o)
	}
	c.cfg.emit(EventMiss, key, 0, nil)
	// The miss path's own deadline, a whole load timeout from here: the
	// shared one of the GET may be nearly spent.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.loadTimeout)
	defer cancel()
	return c.readOrLock(ctx, key, load, o, skip, miss)
}

// readOrLock runs read-or-lock until it finds a value or takes the lock,
// waiting for the holder's commit between attempts, at most the retry
// budget; skip is bytes at key that do not count as a value, miss what the
// flight found there (see verdict).
func (c *Cache[V]) readOrLock(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions, skip []byte, miss verdict[V]) (*result[V], error) {
	lk := newLoadLock(key)
	var w waiter
	for attempt := 1; ; attempt++ {
		at := time.Now()
		cmd := readOrLockScript.Run(ctx, c.rdb, lk.keys(), lk.token, c.cfg.lockTTL.Milliseconds(), skip)
		err := cmd.Err()
		if err != nil && !w.start.IsZero() && ctx.Err() != nil && !isReply(err) {
			// The load timeout fell inside a retry: the wait's budget ran
			// out, not Redis. The lock may be ours if only the reply was lost.
			c.releaseLost(ctx, lk)
			err := c.notAcquired(ctx, key)
			c.reportWait(key, w.start, err)
			return nil, err
		}
		switch step, b := lockStepOf(c.redisCall(key, err), cmd); step {
		case lockFound:
			v := c.judge(key, c.decode(ctx, key, b, at), o, true)
			if r := c.answerVerdict(ctx, key, load, o, v); r != nil {
				c.reportWait(key, w.start, nil)
				return r, nil
			}
			skip, miss = b, v
		case lockTaken:
			c.reportWait(key, w.start, nil)
			return c.loadHeld(ctx, miss.loadKey(key, key, lk, at), load, o)
		case lockHeld:
			if w.start.IsZero() {
				w.start = time.Now()
				c.cfg.emit(EventLockContended, key, 0, nil)
			}
		case lockTransient:
			w.transient = err
			if !c.cfg.retry.wait(ctx, attempt) { // no longer transient: say what it was
				return nil, fmt.Errorf("cache: redis: still failing after %d retries: %w", attempt-1, err)
			}
			continue
		case lockFatal:
			return nil, lockError(key, cmd)
		default:
			return c.lostReply(ctx, key, lk, err, w.transient, load, o)
		}
		if !c.waitForHolder(ctx, key, &w, &attempt) {
			err := c.notAcquired(ctx, key)
			c.reportWait(key, w.start, err)
			return nil, err
		}
	}
}

// waiter is one flight's wait for another holder.
type waiter struct {
	start      time.Time // when it began; zero: no wait yet
	transient  error     // the last transient reply, named if the timeout ends the wait
	subscribed bool      // a wait has returned early to re-read after subscribing
}

// waitForHolder waits for key's holder to commit or release (woken by the notifier,
// or one backoff) and reports whether the flight may try again.
func (c *Cache[V]) waitForHolder(ctx context.Context, key string, w *waiter, attempt *int) bool {
	if *attempt <= c.cfg.retry.max {
		began := time.Now()
		if c.notify.Wait(ctx, key, c.cfg.retry.backoff) {
			c.cfg.emit(EventWoken, key, 0, nil)
		} else if !w.subscribed && time.Since(began) < c.cfg.retry.backoff/2 && ctx.Err() == nil {
			*attempt--          // the wait only subscribed, so that the next read misses no commit: not a retry
			w.subscribed = true // once: any other early return counts, so a flight can never spin
		}
	}
	return *attempt <= c.cfg.retry.max && ctx.Err() == nil
}

// lostReply ends a read-or-lock whose reply was lost to an outage (see
// releaseLost).
func (c *Cache[V]) lostReply(ctx context.Context, key string, lk *loadLock, err, transient error, load func(context.Context) (V, error), o callOptions) (*result[V], error) {
	c.releaseLost(ctx, lk)
	if transient != nil && ctx.Err() != nil { // the load timeout ended a transient wait: name both
		return nil, fmt.Errorf("cache: redis: still failing when the load timeout ended: %w (before it: %w)", err, transient)
	}
	return c.redisFailed(ctx, key, err, load, o)
}

// reportWait reports the end of a wait for another holder, if there was one.
func (c *Cache[V]) reportWait(key string, start time.Time, err error) {
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
// this version can read, or a value that DeleteByTag or Clear removed. A
// value the codec cannot decode (another Cache's value type, say) is a miss
// too, sent to the observer as EventDecodeError and to the error hook once
// per key (see decodeReports), unless the key's quarantine answers it.
func (c *Cache[V]) decode(ctx context.Context, key string, b []byte, at time.Time) *result[V] {
	return c.decodeFor(key, b, at, func(st record.Stamp) (bool, error) { return c.tags.Current(ctx, st) })
}

// decodeFor is decode with the check of a record's stamp given: a batch
// reads the versions of all its records at once.
func (c *Cache[V]) decodeFor(key string, b []byte, at time.Time, current func(record.Stamp) (bool, error)) *result[V] {
	flags, payload, err := record.Decode(b)
	if err != nil {
		return nil
	}
	st, ok := c.stampRead(key, b, current)
	if !ok {
		return nil
	}
	if flags&record.FlagNotFound != 0 {
		return &result[V]{notFound: ErrNotFound, at: at, stamp: st}
	}
	r := &result[V]{data: payload, hasV: true, at: at, stamp: st}
	if err := c.unmarshal(payload, &r.v); err != nil {
		var pe *PanicError
		if !errors.As(err, &pe) {
			c.cfg.emit(EventDecodeError, key, 0, err)
			if c.cfg.onError != nil && c.share.decodes.first(key) {
				c.cfg.onError(key, err)
			}
			return c.quarantine.held(key, at) // nil: a miss, to be replaced
		}
		return &result[V]{err: err, at: at} // a broken codec: reloading would not help
	}
	c.quarantine.decoded(key, payload)
	r.freshness, _ = record.ReadFreshness(b)
	r.throttled = b[1]&record.FlagThrottled != 0
	r.expired = b[1]&record.FlagExpired != 0
	r.head = b[:len(b)-len(payload)]
	return r
}

// answerVerdict answers a flight with what judge said of a record it read: a value
// due for refresh is refreshed in the background, and a stale one may be
// replaced by its refresh (see refreshDue). nil means a miss.
func (c *Cache[V]) answerVerdict(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions, v verdict[V]) *result[V] {
	if v.due {
		ds := []due[V]{{key: key, name: key, old: v.hit}}
		if f := c.refreshDue(ctx, ds, loadOne(load), o.store)[key]; f != nil {
			return f
		}
	}
	return v.hit
}

// loadHeld loads k, whose lock the flight holds, and commits it (see
// loadMisses).
func (c *Cache[V]) loadHeld(ctx context.Context, k loadKey, load func(context.Context) (V, error), o callOptions) (*result[V], error) {
	rs, errs := c.loadMisses(ctx, []loadKey{k}, loadOne(load), o.store)
	return rs[0], errs[0]
}

// loadMisses loads the misses of keys through loadFor; a key whose load
// failed with a fallback (a value expired by hand) is answered with the
// fallback, stale, kept for the throttle (see lockEndFor). A quarantined
// key keeps what it loaded (see quarantine).
func (c *Cache[V]) loadMisses(ctx context.Context, keys []loadKey, load loaderFunc[V], store storeChoice) ([]*result[V], []error) {
	rs, errs := c.loadFor(ctx, keys, load, store)
	for i, k := range keys {
		if errs[i] == nil {
			c.quarantine.loaded(k.key, rs[i], k.locked)
		}
		if errs[i] != nil && k.fallback != nil && k.lk != nil {
			c.cfg.emit(EventStaleServed, k.key, 0, ErrRefreshFailed)
			rs[i], errs[i] = &result[V]{data: k.fallback, stale: true, at: k.locked, stamp: k.prior}, nil
		}
	}
	return rs, errs
}

// redisFailed applies the failure policy to a Redis outage, or to Redis
// refusing the lock for want of memory (OOM), which FailOpen meets as it
// meets an outage: one load per key per process at a time, uncached.
func (c *Cache[V]) redisFailed(ctx context.Context, key string, err error, load func(context.Context) (V, error), o callOptions) (*result[V], error) {
	if err := c.outage(ctx, key, err); err != nil {
		return nil, err
	}
	return c.loadHeld(ctx, loadKey{key: key, name: key}, load, o) // SetTTL works, though nothing is stored
}

// outage applies the failure policy to key, which Redis could not serve
// (err: the Redis error, or the open breaker's): nil under FailOpen while
// the load timeout allows, to load key uncached; else the caller's error.
func (c *Cache[V]) outage(ctx context.Context, key string, err error) error {
	if !errors.Is(err, ErrCircuitOpen) {
		err = fmt.Errorf("cache: redis: %w", err)
	}
	if ctx.Err() != nil || c.cfg.policy == FailClosed {
		return err
	}
	if !errors.Is(err, ErrCircuitOpen) { // an open breaker is reported once, as EventBreakerOpen
		c.report(key, err)
	}
	return nil
}
