// getset.go is the direct access to the cache: Get reads without loading,
// Set writes through after the application changed the source.

package cache

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/set.lua
	setLua    string
	setScript = redis.NewScript(setLua)
)

// Get returns the value cached at key without loading it. Errors:
// [ErrCacheMiss] when Redis holds no readable value (absent, expired past
// every grace, or unreadable); [ErrNotFound] when a loader's not-found is
// cached; [ErrEmptyKey], [ErrReservedKey]; [ErrCircuitOpen] while the
// breaker is open; a Redis error wrapped as "cache: redis: ..."; a decoding
// error. A value past its TTL that [WithStale] still serves is returned,
// and marked in [WithResultInfo], unless opts hold [NoStale]; Get never
// refreshes it. Get is not merged with other callers: each call is one GET.
// A ctx already ended returns ctx.Err() at once, without a Redis call.
func (c *Cache[V]) Get(ctx context.Context, key string, opts ...CallOption) (V, error) {
	var zero V
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return zero, err
	}
	o := parseCall(opts)
	if v, ok := c.nearGet(key); ok { // the near cache keeps only values within their TTL
		return v, nil
	}
	key, err := c.key(key)
	if err != nil {
		return zero, err
	}
	if !c.brk.allow() {
		return zero, c.brk.err()
	}
	tk := c.nearTicket(key)
	at := time.Now()
	b, err := c.redisio.Get(ctx, key)
	switch c.redisCall(key, err) {
	case errNone:
	default:
		return zero, fmt.Errorf("cache: redis: %w", err)
	}
	if errors.Is(err, redis.Nil) {
		return zero, ErrCacheMiss
	}
	r := c.decode(key, b, at)
	if r == nil {
		return zero, ErrCacheMiss
	}
	if r.notFound != nil {
		return zero, notFound(key)
	}
	if r.err == nil {
		switch c.cfg.ageOf(r.fresh, r.throttled, at, nil) { // Get never refreshes
		case ageExpired:
			return zero, ErrCacheMiss
		case ageStale:
			if o.noStale {
				return zero, ErrCacheMiss
			}
			markStale(ctx)
		}
		if c.near != nil {
			c.near.keep(c, key, tk, r)
		}
	}
	return c.value(r)
}

// Set stores v at key for the TTL (with jitter), or for the [TTL] in opts,
// as GetOrLoad would after a load: call it after writing the source, when the new value is at hand. It
// wins over a load in flight in any process: the load's lock is voided, so
// the older value it loaded is never stored over v, and callers that begin
// after Set returns get v (or newer). Waiters on the key are woken. Errors:
// [ErrEmptyKey], [ErrReservedKey]; an encoding error (nothing is written);
// a Redis error wrapped as "cache: redis: ...". Transient cluster errors
// are retried within the retry budget. A ctx already ended returns
// ctx.Err() at once, writing nothing.
func (c *Cache[V]) Set(ctx context.Context, key string, v V, opts ...CallOption) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	o := parseCall(opts)
	key, err := c.key(key)
	if err != nil {
		return err
	}
	data, err := c.marshal(v)
	if err != nil {
		return fmt.Errorf("cache: encode value for %q: %w", key, err)
	}
	defer c.group.Forget(key) // later callers must not join a flight that began before the write
	defer c.nearDrop(key)
	ttl := c.cfg.ttl
	if o.ttl > 0 {
		ttl = o.ttl
	}
	rec, px := c.wrap(data, 0, ttl)
	keys, args := []string{key, LockKey(key)}, []any{rec, px.Milliseconds(), c.notify.Channel(key)}
	return c.writeConfirmed(ctx, []string{key}, func(err error) errClass { return c.redisCall(key, err) },
		func(p redis.Pipeliner) { p.Eval(ctx, setLua, keys, args...) },
		func() error { return setScript.Run(ctx, c.rdb, keys, args...).Err() })
}
