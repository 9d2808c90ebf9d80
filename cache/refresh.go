// refresh.go reloads a value in the background, before it expires (early
// refresh) or once it is stale, under the key's load lock and with the same
// fenced commit as a load, so that it runs once per key across processes
// while callers keep getting the current value.

package cache

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/lock.lua
	lockLua    string
	lockScript = redis.NewScript(lockLua)
)

// refresh starts a background refresh of key, unless one is already running
// in this process. The returned channel yields the fresh result, or nil when
// the refresh did not produce one (another process holds the lock, the
// loader failed); it is nil when no refresh was started. The refresh runs
// on ctx's values without its cancellation, bounded by the load timeout;
// [Cache.Close] waits for it.
func (c *Cache[V]) refresh(ctx context.Context, key string, load func(context.Context) (V, error), old *result[V]) <-chan *result[V] {
	if _, running := c.refreshing.LoadOrStore(key, struct{}{}); running {
		return nil
	}
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.closed { // Close is waiting for the background work: start none
		c.refreshing.Delete(key)
		return nil
	}
	done := make(chan *result[V], 1)
	c.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.loadTimeout)
		defer cancel()
		began := time.Now()
		r, err := c.refreshLocked(ctx, key, load, old)
		if r != nil || err != nil {
			c.cfg.emit(EventRefresh, key, time.Since(began), err)
		}
		c.refreshed(key, r, err)
		done <- r
	})
	return done
}

// refreshed ends this process's refresh of key. One that stored nothing
// keeps the key marked for a while, so that the next hits do not try again
// at once: for a retry backoff when another process holds the lock (its
// commit is due), for the stale throttle when the refresh failed, so that
// a failing database is not called on every hit.
func (c *Cache[V]) refreshed(key string, r *result[V], err error) {
	var wait time.Duration
	switch {
	case err != nil:
		wait = c.cfg.throttle
	case r == nil:
		wait = c.cfg.retry.backoff
	}
	if wait <= 0 {
		c.refreshing.Delete(key)
		return
	}
	time.AfterFunc(wait, func() { c.refreshing.Delete(key) })
}

// refreshLocked takes the lock (if free) and reloads; after a loader
// failure it keeps the stale value for the throttle, when stale serving is
// on. (nil, nil) means someone else holds the lock.
func (c *Cache[V]) refreshLocked(ctx context.Context, key string, load func(context.Context) (V, error), old *result[V]) (*result[V], error) {
	lk := newLoadLock(key)
	locked := time.Now()
	n, err := lockScript.Run(ctx, c.rdb, lk.keys(), lk.token, c.cfg.lockTTL.Milliseconds(), old.head).Int()
	if class := c.redisCall(key, err); class != errNone {
		if class == errOutage {
			c.release(ctx, key, lk, locked) // the lock is ours if only the reply was lost
		}
		return nil, fmt.Errorf("cache: redis: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	var fallback []byte
	if c.cfg.stale > 0 {
		fallback = old.data
	}
	return c.load(ctx, key, lk, locked, load, fallback)
}
