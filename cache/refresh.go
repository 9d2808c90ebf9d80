// This file reloads values in the background, before they expire (early
// refresh) or once they are stale, under their load locks and through the
// same load and fenced commit as a miss (loadFor), so that each runs once
// per key across processes while callers keep getting the current value.
// GetOrLoad refreshes one key, GetOrLoadMany every key of its batch that is
// due, with one loader call.

package cache

import (
	"context"
	_ "embed"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redisio"
)

var (
	//go:embed scripts/lock.lua
	lockLua    string
	lockScript = redis.NewScript(lockLua)
)

// due is a value read that calls for a refresh: due for early refresh, or
// stale.
type due[V any] struct {
	key  string     // full key
	name string     // the caller's key, as the loader takes it
	old  *result[V] // what was read; old.stale when served past its TTL
}

// refreshDue starts the refreshes of ds in one background load and, when
// a stale value is among those started, waits up to the soft load timeout
// for it: once for all of ds, not once per key. It returns the fresh
// results that replace stale values, by key, and reports the stale values
// served (EventStaleServed). store is what the call chose for the values
// it stores (its TTL unset: each value's own, or the Cache's); a refreshed
// value keeps its tags.
func (c *Cache[V]) refreshDue(ctx context.Context, ds []due[V], load loaderFunc[V], store storeChoice) map[string]*result[V] {
	if len(ds) == 0 {
		return nil
	}
	started, done := c.refreshMany(ctx, ds, load, store)
	soft := c.cfg.softTimeout
	wait := false
	for _, d := range ds {
		wait = wait || d.old.stale && started[d.key] && soft > 0
	}
	var got map[string]*result[V]
	timedOut := false
	if wait {
		t := time.NewTimer(soft)
		defer t.Stop()
		select {
		case got = <-done:
		case <-t.C:
			timedOut = true
		}
	}
	replaced := map[string]*result[V]{}
	for _, d := range ds {
		if !d.old.stale {
			continue
		}
		var why error
		switch r := got[d.key]; {
		case !started[d.key] || soft <= 0:
		case timedOut:
			why = fmt.Errorf("cache: refresh of %q still running after the soft load timeout (%v): %w", d.key, soft, context.DeadlineExceeded)
		case r != nil && !r.stale:
			replaced[d.key] = r
			continue
		default:
			why = ErrRefreshFailed
		}
		c.cfg.emit(EventStaleServed, d.key, 0, why)
	}
	return replaced
}

// refreshMany starts one background refresh of the keys of ds that this
// process is not refreshing yet: one lock round, one load for the keys
// whose lock it took, one fenced commit round. Keys whose lock another
// process holds are left to it. It returns the keys it started and a
// channel that yields their fresh results by key (a key whose refresh
// produced none is absent); nil when it started none. The refresh runs on
// ctx's values without its cancellation, bounded by the load timeout;
// [Cache.Close] waits for it.
func (c *Cache[V]) refreshMany(ctx context.Context, ds []due[V], load loaderFunc[V], store storeChoice) (started map[string]bool, done <-chan map[string]*result[V]) {
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
		rs, errs := c.refreshLocked(ctx, mine, load, store)
		took := time.Since(began)
		results := make(map[string]*result[V], len(mine))
		for i, d := range mine {
			if rs[i] != nil || errs[i] != nil {
				c.cfg.emit(EventRefresh, d.key, took, errs[i])
			}
			c.refreshed(d.key, rs[i], errs[i])
			if rs[i] != nil {
				results[d.key] = rs[i]
			}
		}
		ch <- results
	})
	return started, ch
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

// refreshLocked takes the locks of ds that are free and reloads those
// keys. For each key: its fresh result, or its error, or neither when
// another process holds its lock. A panic (none is expected: loader and
// codec panics are already errors) releases the locks and is every key's
// error.
func (c *Cache[V]) refreshLocked(ctx context.Context, ds []due[V], load loaderFunc[V], store storeChoice) (rs []*result[V], errs []error) {
	rs, errs = make([]*result[V], len(ds)), make([]error, len(ds))
	held, idx := c.lockDue(ctx, ds, errs)
	if len(held) == 0 {
		return rs, errs
	}
	loading := true
	defer func() {
		if p := recover(); p != nil {
			err := &PanicError{in: "refresh", Value: p, stack: debug.Stack()}
			for i := range ds {
				rs[i], errs[i] = nil, err
			}
			if loading {
				lks := make([]*loadLock, len(held))
				for j, k := range held {
					lks[j] = k.lk
				}
				c.endLocks(ctx, releases(lks))
			}
		}
	}()
	hrs, herrs := c.loadFor(ctx, held, load, store)
	loading = false
	for j, i := range idx {
		rs[i], errs[i] = hrs[j], herrs[j]
	}
	return rs, errs
}

// lockDue takes, in one round, the load locks of ds whose value is still
// the one read (lock.lua checks its head). It returns the keys it holds,
// and for each ds[idx[j]] it holds, held[j]; Redis errors go to errs.
func (c *Cache[V]) lockDue(ctx context.Context, ds []due[V], errs []error) (held []loadKey, idx []int) {
	calls := make([]redisio.ScriptCall, len(ds))
	keys := make([]string, len(ds))
	lks := make([]*loadLock, len(ds))
	for i, d := range ds {
		keys[i], lks[i] = d.key, newLoadLock(d.key)
		calls[i] = redisio.ScriptCall{Keys: lks[i].keys(), Args: []any{lks[i].token, c.cfg.lockTTL.Milliseconds(), d.old.head}}
	}
	locked := time.Now()
	cmds := c.eval(ctx, redisio.ScriptRun{Script: lockScript, Src: lockLua, Calls: calls})
	cerrs := errsOf(cmds)
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
			v := verdict[V]{prior: ds[i].old, fallback: c.cfg.stale > 0} // stale-while-revalidate keeps it for the throttle
			held, idx = append(held, v.loadKey(ds[i].key, ds[i].name, lks[i], locked)), append(idx, i)
		}
	}
	if len(orphans) > 0 {
		c.endLocks(ctx, releases(orphans))
	}
	return held, idx
}
