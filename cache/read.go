// This file is Get: one read of Redis (or of the near cache), no load.

package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// get is Get with its options read.
func (c *Cache[V]) get(ctx context.Context, key string, o callOptions) (V, error) {
	var zero V
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return zero, err
	}
	if !o.skipNear {
		if v, ok := c.nearGet(key, nil); ok { // the near cache keeps only values within their TTL
			return v, nil
		}
	}
	key, err := c.key(key)
	if err != nil {
		return zero, err
	}
	if !c.brk.Allow() {
		return zero, c.brk.Err()
	}
	tk := c.nearTicket(key)
	at := time.Now()
	b, current, tracked, err := c.read(ctx, key, true)
	switch c.redisCall(key, err) {
	case errNone:
	default:
		return zero, fmt.Errorf("cache: redis: %w", err)
	}
	// Counted as GetOrLoad's reads are: a hit, a stale value served, or a
	// miss (see Stats); judge reports the first two.
	var r *result[V]
	if !errors.Is(err, redis.Nil) {
		r = c.judge(key, markTracked(c.decodeFor(key, b, at, current), tracked), o, false).hit
	}
	switch {
	case r == nil:
		c.cfg.emit(EventMiss, key, 0, nil)
		return zero, ErrCacheMiss
	case r.notFound != nil:
		return zero, notFound(key)
	case r.err != nil:
		return zero, r.err
	}
	if r.stale {
		markStale(ctx)
	}
	if c.near != nil {
		c.near.keep(c, key, tk, r)
	}
	return c.value(r)
}
