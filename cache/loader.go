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
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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
	rdb   redis.UniversalClient
	cfg   config
	group singleflight.Group // merges this process's callers of one key
}

// New returns a Cache on rdb, which may be a *redis.Client, *redis.ClusterClient
// or failover client. Invalid options panic, naming the option: they are
// programming errors, found at start-up.
func New[V any](rdb redis.UniversalClient, opts ...Option) *Cache[V] {
	if rdb == nil {
		panic("cache: New: nil Redis client")
	}
	return &Cache[V]{rdb: rdb, cfg: newConfig(opts)}
}

// result is what one flight hands to all of its callers.
type result[V any] struct {
	data     []byte      // the codec's bytes; each caller decodes its own copy
	notFound error       // non-nil: the value does not exist; what callers get
	v        V           // on a hit, data already decoded once...
	hasV     bool        // ...for the first caller to take
	taken    atomic.Bool // whether v has been handed out
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
// ctx.Err(), without disturbing the flight.
//
// Every caller gets its own decoded copy of the value. Errors: [ErrEmptyKey],
// [ErrNilLoader]; [ErrNotFound] when load (now or within the not-found TTL)
// returned it; load's own error unchanged (a panic in load becomes an error);
// [ErrLockNotAcquired] when the retry budget ran out while another process
// was loading; an error wrapping context.DeadlineExceeded when the load
// timeout ended the wait, the loader or a Redis call; a Redis error under
// [FailClosed]; an encoding error when the codec cannot encode the loaded
// value (nothing is cached). Errors the cache absorbs instead of returning go
// to [WithErrorHook].
func (c *Cache[V]) GetOrLoad(ctx context.Context, key string, load func(ctx context.Context) (V, error)) (V, error) {
	var zero V
	key, err := c.key(key)
	if err != nil {
		return zero, err
	}
	if load == nil {
		return zero, ErrNilLoader
	}
	ch := c.group.DoChan(key, func() (r any, err error) {
		defer func() { // a panic decoding a hit: an error for the callers, not a crash
			if p := recover(); p != nil {
				err = &panicError{in: "flight", value: p, stack: debug.Stack()}
			}
		}()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.loadTimeout)
		defer cancel()
		return c.fetch(fctx, key, load)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return zero, r.Err
		}
		return c.value(r.Val.(*result[V]))
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// value hands a flight's result to one caller.
func (c *Cache[V]) value(r *result[V]) (V, error) {
	var v V
	if r.notFound != nil {
		return v, r.notFound
	}
	if r.hasV && !r.taken.Swap(true) {
		return r.v, nil
	}
	if err := c.cfg.codec.Unmarshal(r.data, &v); err != nil {
		return v, fmt.Errorf("cache: decode value: %w", err)
	}
	return v, nil
}

// Delete removes the values at keys and their load locks. A load in flight
// for one of them when Delete runs finds its lock gone and writes nothing, so
// the next read loads fresh data. Keys may be in different cluster slots.
func (c *Cache[V]) Delete(ctx context.Context, keys ...string) error {
	full := make([]string, len(keys))
	for i, k := range keys {
		k, err := c.key(k)
		if err != nil {
			return err
		}
		full[i] = k
	}
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range full {
			p.Del(ctx, k, LockKey(k))
		}
		return nil
	})
	for _, k := range full {
		c.group.Forget(k) // later callers must not join a flight that began before the delete
	}
	return err
}

// key checks a caller's key and returns it with the prefix.
func (c *Cache[V]) key(k string) (string, error) {
	if k == "" {
		return "", ErrEmptyKey
	}
	k = c.cfg.prefix + k
	if isLockName(k) {
		return "", fmt.Errorf("%w: %q", ErrReservedKey, k)
	}
	return k, nil
}

// fetch is one flight: read, then read-or-lock until a value or the lock.
func (c *Cache[V]) fetch(ctx context.Context, key string, load func(context.Context) (V, error)) (*result[V], error) {
	b, err := c.rdb.Get(ctx, key).Bytes()
	var skip []byte // bytes at key we could not decode: a miss, to be replaced
	switch {
	case err == nil:
		if r := c.decode(b); r != nil {
			return r, nil
		}
		skip = b
	case errors.Is(err, redis.Nil), isWrongType(err):
	default:
		return c.redisFailed(ctx, key, err, load)
	}

	lk := newLoadLock(key)
	for attempt := 1; ; attempt++ {
		res, err := readOrLockScript.Run(ctx, c.rdb, lk.keys(),
			lk.token, c.cfg.lockTTL.Milliseconds(), skip).Slice()
		if err != nil {
			// The lock is ours if only the reply was lost. Release it in the
			// background: on a stalled Redis a second round trip would double
			// the wait before the failure policy applies. The goroutine ends
			// with the release, which is bounded like every commit and release.
			go c.release(ctx, key, lk)
			return c.redisFailed(ctx, key, err, load)
		}
		if res[0].(int64) == 1 {
			b := []byte(res[1].(string))
			if r := c.decode(b); r != nil {
				return r, nil
			}
			skip = b
		} else if res[1].(int64) == 1 {
			return c.load(ctx, key, lk, load)
		}
		if !c.cfg.retry.wait(ctx, attempt) {
			return nil, notAcquired(ctx)
		}
	}
}

// decode reads a record; nil means it is not one this version can read.
func (c *Cache[V]) decode(b []byte) *result[V] {
	flags, payload, err := decodeRecord(b)
	if err != nil {
		return nil
	}
	if flags&flagNotFound != 0 {
		return &result[V]{notFound: ErrNotFound}
	}
	r := &result[V]{data: payload, hasV: true}
	if c.cfg.codec.Unmarshal(payload, &r.v) != nil {
		return nil
	}
	return r
}

// load runs the loader as the lock holder, with the watchdog extending the
// lease, and commits the outcome.
func (c *Cache[V]) load(ctx context.Context, key string, lk *loadLock, load func(context.Context) (V, error)) (*result[V], error) {
	stop := c.watchdog(ctx, lk)
	v, err := callLoader(ctx, load)
	stop()
	r, err := c.outcome(key, v, err)
	switch {
	case err != nil, r.notFound != nil && c.cfg.notFoundTTL == 0:
		c.release(ctx, key, lk)
	case r.notFound != nil:
		c.commit(ctx, key, lk, encodeRecord(flagNotFound, nil), c.cfg.notFoundTTL)
	default:
		c.commit(ctx, key, lk, encodeRecord(0, r.data), c.jittered(c.cfg.ttl))
	}
	return r, err
}

// outcome turns what the loader returned into a flight result. On success
// every caller, the first included, decodes the encoded bytes, so that all
// see exactly what the cache stores.
func (c *Cache[V]) outcome(key string, v V, err error) (*result[V], error) {
	var pe *panicError
	switch {
	case errors.As(err, &pe): // even a panic with ErrNotFound is a failure
		return nil, err
	case errors.Is(err, ErrNotFound):
		return &result[V]{notFound: err}, nil
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
			err = &panicError{in: "codec", value: p, stack: debug.Stack()}
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

// commit writes record if the lock is still ours. The loaded value is
// returned to the callers either way: it is what the source said, only a
// newer writer (or a Delete) keeps it out of Redis.
func (c *Cache[V]) commit(ctx context.Context, key string, lk *loadLock, record []byte, ttl time.Duration) {
	ctx, cancel := c.cleanup(ctx)
	defer cancel()
	n, err := commitScript.Run(ctx, c.rdb, lk.keys(), lk.token, record, ttl.Milliseconds()).Int()
	switch {
	case err != nil:
		c.report(key, fmt.Errorf("cache: store %q: %w", key, err))
	case n == 0:
		c.report(key, fmt.Errorf("cache: loaded value for %q not stored, the lock was lost: %w", key, ErrLockNotHeld))
	}
}

// release gives the lock up; if it is no longer ours there is nothing to do.
func (c *Cache[V]) release(ctx context.Context, key string, lk *loadLock) {
	ctx, cancel := c.cleanup(ctx)
	defer cancel()
	if err := lk.release(ctx, c.rdb); err != nil && !errors.Is(err, ErrLockNotHeld) {
		c.report(key, fmt.Errorf("cache: release lock of %q: %w", key, err))
	}
}

func (c *Cache[V]) report(key string, err error) {
	if c.cfg.onError != nil {
		c.cfg.onError(key, err)
	}
}

// watchdog extends lk every lockTTL/3 until the returned stop is called or
// the lock turns out to be lost. stop waits for the goroutine to end.
func (c *Cache[V]) watchdog(ctx context.Context, lk *loadLock) (stop func()) {
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
				if errors.Is(lk.extend(ctx, c.rdb, c.cfg.lockTTL), ErrLockNotHeld) {
					return
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// redisFailed applies the failure policy to a Redis error.
func (c *Cache[V]) redisFailed(ctx context.Context, key string, err error, load func(context.Context) (V, error)) (*result[V], error) {
	err = fmt.Errorf("cache: redis: %w", err)
	if ctx.Err() != nil || c.cfg.policy == FailClosed {
		return nil, err
	}
	c.report(key, err)
	v, err := callLoader(ctx, load)
	return c.outcome(key, v, err)
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

func isWrongType(err error) bool { return redis.HasErrorPrefix(err, "WRONGTYPE") }
