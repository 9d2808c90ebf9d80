// refresh.go reloads a value in the background, before it expires (early
// refresh) or once it is stale, under the key's load lock and with the same
// fenced commit as a load, so that it runs once per key across processes
// while callers keep getting the current value.

package cache

import (
	"context"
	_ "embed"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
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

// due is a value a batch read that calls for a refresh: due for early
// refresh, or stale.
type due[V any] struct {
	key  string     // full key
	name string     // the caller's key, as loadMany takes it
	old  *result[V] // what was read; old.stale when served past its TTL
}

// refreshMany starts one background refresh of the keys of ds that this
// process is not refreshing yet: one pipelined lock round, one call of
// loadMany (which takes and returns the callers' keys) for the keys whose
// lock it took, and one pipelined fenced commit round, so that the
// refreshes a batch starts cost one loader call, not one per key. Keys
// whose lock another process holds are left to it. It returns the keys it
// started and a channel that yields their fresh results by key (a key
// whose refresh produced none is absent); nil when it started none. Close
// waits for it, as for [Cache.refresh].
func (c *Cache[V]) refreshMany(ctx context.Context, ds []due[V], loadMany func(context.Context, []string) (map[string]V, error)) (started map[string]bool, done <-chan map[string]*result[V]) {
	var mine []due[V]
	for _, d := range ds {
		if _, running := c.refreshing.LoadOrStore(d.key, struct{}{}); !running {
			mine = append(mine, d)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.closed { // Close is waiting for the background work: start none
		for _, d := range mine {
			c.refreshing.Delete(d.key)
		}
		return nil, nil
	}
	started = make(map[string]bool, len(mine))
	for _, d := range mine {
		started[d.key] = true
	}
	ch := make(chan map[string]*result[V], 1)
	c.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.loadTimeout)
		defer cancel()
		began := time.Now()
		rs, errs := c.refreshLockedMany(ctx, mine, loadMany)
		took := time.Since(began)
		fresh := make(map[string]*result[V], len(mine))
		for i, d := range mine {
			if rs[i] != nil || errs[i] != nil {
				c.cfg.emit(EventRefresh, d.key, took, errs[i])
			}
			c.refreshed(d.key, rs[i], errs[i])
			if rs[i] != nil {
				fresh[d.key] = rs[i]
			}
		}
		ch <- fresh
	})
	return started, ch
}

// refreshLockedMany is refreshLocked for the keys of ds at once. For each
// key: its fresh result, or its error, or neither when another process
// holds its lock. A panic (none is expected: loader and codec panics are
// already errors) releases the locks and is every key's error.
func (c *Cache[V]) refreshLockedMany(ctx context.Context, ds []due[V], loadMany func(context.Context, []string) (map[string]V, error)) (rs []*result[V], errs []error) {
	rs, errs = make([]*result[V], len(ds)), make([]error, len(ds))
	var held []*heldKey
	var idx []int // held[j] is ds[idx[j]]
	ended := false
	defer func() {
		if p := recover(); p != nil {
			err := &PanicError{in: "refresh", Value: p, stack: debug.Stack()}
			for i := range ds {
				rs[i], errs[i] = nil, err
			}
			if !ended {
				ops := make([]lockOp, len(held))
				for j, h := range held {
					ops[j] = lockOp{key: h.key, lk: h.lk}
				}
				c.commitMany(ctx, ops)
			}
		}
	}()

	calls := make([]scriptCall, len(ds))
	keys := make([]string, len(ds))
	lks := make([]*loadLock, len(ds))
	for i, d := range ds {
		keys[i], lks[i] = d.key, newLoadLock(d.key)
		calls[i] = scriptCall{lks[i].keys(), []any{lks[i].token, c.cfg.lockTTL.Milliseconds(), d.old.head}}
	}
	locked := time.Now()
	cmds := c.evalMany(ctx, lockScript, lockLua, calls)
	cerrs := make([]error, len(cmds))
	for i, cmd := range cmds {
		cerrs[i] = cmd.Err()
	}
	var orphans []*loadLock
	for i, class := range c.round(keys, cerrs) {
		n, err := cmds[i].Int()
		switch {
		case class == errOutage:
			orphans = append(orphans, lks[i]) // ours if only the reply was lost
			fallthrough
		case err != nil:
			errs[i] = fmt.Errorf("cache: redis: %w", err)
		case n == 1:
			held = append(held, &heldKey{key: ds[i].key, lk: lks[i], locked: locked})
			idx = append(idx, i)
		}
	}
	if len(orphans) > 0 {
		c.releaseMany(ctx, orphans)
	}
	if len(held) == 0 {
		return rs, errs
	}

	names := make([]string, len(held))
	for j, i := range idx {
		names[j] = ds[i].name
	}
	stop := c.batchWatchdog(ctx, held)
	opts := &loadOptions{}
	began := time.Now()
	m, err := callLoader(context.WithValue(ctx, loadOptionsKey{}, opts), func(ctx context.Context) (map[string]V, error) {
		return loadMany(ctx, names)
	})
	took := time.Since(began)
	c.cfg.emit(EventLoad, held[0].key, took, err)
	stop()

	ttl := c.cfg.ttl
	if opts.ttl > 0 {
		ttl = opts.ttl
	}
	ops := make([]lockOp, len(held))
	for j, h := range held {
		i := idx[j]
		ops[j] = lockOp{key: h.key, lk: h.lk}
		r, kerr := (*result[V])(nil), err
		if kerr == nil {
			if v, ok := m[ds[i].name]; ok {
				r, kerr = c.outcome(h.key, v, nil)
			} else {
				r = &result[V]{notFound: ErrNotFound}
			}
		}
		rs[i], errs[i] = r, kerr
		switch {
		case kerr != nil && c.cfg.stale > 0: // stale-if-error: keep the old value for the throttle
			c.report(h.key, fmt.Errorf("cache: refresh of %q failed; its stale value is served for %v more: %w", h.key, c.cfg.throttle, kerr))
			ops[j].record = record.EncodeFresh(flagThrottled, record.Freshness{Expiry: time.Now().Add(c.cfg.throttle), Load: took}, ds[i].old.data)
			ops[j].px = addSat(c.cfg.throttle, c.cfg.stale)
		case kerr != nil, opts.noCache, r.notFound != nil && c.cfg.notFoundTTL == 0: // released
		case r.notFound != nil:
			ops[j].record, ops[j].px = record.Encode(record.FlagNotFound, nil), c.cfg.notFoundTTL
		default:
			ops[j].record, ops[j].px = c.record(r.data, took, ttl)
		}
	}
	stored := c.commitMany(ctx, ops)
	ended = true
	for j, h := range held {
		if r := rs[idx[j]]; r != nil {
			r.at = h.locked
			if !stored[j].IsZero() {
				r.at = stored[j]
			}
		}
	}
	return rs, errs
}
