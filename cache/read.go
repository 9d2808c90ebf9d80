// read.go is Get: one read of Redis (or of the near cache), no load.

package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/freshness"
)

// get is Get with its options read.
func (c *Cache[V]) get(ctx context.Context, key string, o callOptions) (V, error) {
	var zero V
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return zero, err
	}
	if !o.skipNear {
		if v, ok := c.nearGet(key); ok { // the near cache keeps only values within their TTL
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
	b, current, err := c.read(ctx, key)
	switch c.redisCall(key, err) {
	case errNone:
	default:
		return zero, fmt.Errorf("cache: redis: %w", err)
	}
	// Counted as GetOrLoad's reads are: a hit, a stale value served, or a
	// miss (see Stats).
	miss := func() (V, error) {
		c.cfg.emit(EventMiss, key, 0, nil)
		return zero, ErrCacheMiss
	}
	if errors.Is(err, redis.Nil) {
		return miss()
	}
	r := c.decodeFor(key, b, at, current)
	if r == nil {
		return miss()
	}
	if r.notFound != nil {
		c.cfg.emit(EventHit, key, 0, nil)
		return zero, notFound(key)
	}
	if r.err == nil {
		switch c.cfg.fresh().Of(r.fresh, r.throttled, at, nil) { // Get never refreshes
		case freshness.Expired:
			return miss()
		case freshness.Stale:
			if o.noStale {
				return miss()
			}
			markStale(ctx)
			c.cfg.emit(EventStaleServed, key, 0, nil)
		default:
			c.cfg.emit(EventHit, key, 0, nil)
		}
		if c.near != nil {
			c.near.keep(c, key, tk, r)
		}
	}
	return c.value(r)
}
