// This file is the second half of the one miss path that GetOrLoad,
// GetOrLoadMany and the refreshes share: one loader call for the keys whose
// load lock the caller took (and, under FailOpen, keys Redis could not
// serve), the locks extended meanwhile, each key's outcome turned into a
// record, and every lock ended in one fenced round.

package cache

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redisio"
	"github.com/stampede-go/stampede/internal/tags"
)

var (
	//go:embed scripts/commit.lua
	commitLua    string
	commitScript = redis.NewScript(commitLua)
)

// loaderFunc loads the values of the callers' keys it is given; a key it
// leaves out of the map does not exist.
type loaderFunc[V any] func(ctx context.Context, names []string) (map[string]V, error)

// loadOne adapts GetOrLoad's loader of one key to a loaderFunc. Its
// [ErrNotFound] (never a panic's) is the key left out of the map.
func loadOne[V any](load func(context.Context) (V, error)) loaderFunc[V] {
	return func(ctx context.Context, names []string) (map[string]V, error) {
		v, err := load(ctx)
		var pe *PanicError
		switch {
		case errors.Is(err, ErrNotFound) && !errors.As(err, &pe):
			return nil, nil
		case err != nil:
			return nil, err
		}
		return map[string]V{names[0]: v}, nil
	}
}

// loadKey is one key of a load.
type loadKey struct {
	key    string    // full key
	name   string    // the caller's key, as the loader takes it
	lk     *loadLock // nil: Redis could not serve the key, which is loaded uncached
	locked time.Time // when the call that took lk was sent
	// fallback is the payload of a stale value being refreshed under
	// WithStale: kept for the throttle if the load fails.
	fallback []byte
	// prior is the stamp of the value being refreshed or reloaded (nil:
	// none): its tags stay, and it stamps the fallback.
	prior *record.Stamp
	// kept is the TTL the value being refreshed was stored with, when a
	// call or a loader chose it; zero: the Cache's.
	kept time.Duration
}

// loadFor calls load once for keys, extending their locks meanwhile, and
// ends every lock: the value committed (fenced by the lock's token) or the
// lock released. store is what the call chose for the values (its TTL
// unset: a refreshed value's own, or the Cache's; see ttlFor); the
// loader's [SetTTL] wins, its [AddTags] adds. Each key gets its result or
// its error, index-aligned with keys; a result's at is when the call that
// vouches for it was sent (see result.at).
func (c *Cache[V]) loadFor(ctx context.Context, keys []loadKey, load loaderFunc[V], store storeChoice) ([]*result[V], []error) {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.name
		if k.lk != nil {
			k.lk.renewed.Store(clock.At(k.locked))
		}
	}
	stop := c.watchdog(ctx, keys)
	opts := &loadOptions{ttl: store.ttl, tags: slices.Clone(store.tags), tagging: c.cfg.tags, single: len(keys) == 1}
	st, err := c.tags.Stamp(ctx, nil) // before the loader reads the source
	if err != nil {
		c.report(keys[0].key, fmt.Errorf("%w; the loaded values are not stored", err))
		opts.noCache = true
	}
	began := time.Now()
	m, err := callLoader(context.WithValue(ctx, loadOptionsKey{}, opts), func(ctx context.Context) (map[string]V, error) {
		return load(ctx, names)
	})
	took := time.Since(began)
	c.cfg.emit(EventLoad, keys[0].key, took, loadEventErr(err, keys, m))
	stop()

	rs, errs := make([]*result[V], len(keys)), make([]error, len(keys))
	var ends []lockEnd
	var held []int // ends[j] is keys[held[j]]'s
	for i, k := range keys {
		if err != nil {
			errs[i] = err
		} else {
			v, ok := m[k.name]
			rs[i], errs[i] = c.resultOf(k.key, v, ok)
		}
		if k.lk == nil {
			c.cfg.emit(EventUncachedLoad, k.key, 0, nil)
			if rs[i] != nil {
				rs[i].at = began // read from the source after this: a caller that joined later asks again
			}
			continue
		}
		ends = append(ends, c.lockEndFor(k, rs[i], errs[i], opts, took, st))
		held = append(held, i)
	}
	stored := c.endLocks(ctx, ends)
	stamps := make([]*record.Stamp, len(ends))
	for j, e := range ends {
		stamps[j] = e.stamp
	}
	vouched := c.tags.Vouched(ctx, stamps)
	for j, i := range held {
		if rs[i] != nil {
			rs[i].at = keys[i].locked
			if !stored[j].IsZero() && vouched[j] {
				rs[i].at, rs[i].stamp = stored[j], ends[j].stamp
			}
		}
	}
	return rs, errs
}

// loadEventErr is EventLoad's Err: the loader's, or ErrNotFound for one key not found.
func loadEventErr[V any](err error, keys []loadKey, m map[string]V) error {
	if err == nil && len(keys) == 1 {
		if _, ok := m[keys[0].name]; !ok {
			return ErrNotFound
		}
	}
	return err
}

// resultOf turns what the loader returned for key into a flight result. On
// success every caller, the first included, decodes the encoded bytes, so
// that all see exactly what the cache stores.
func (c *Cache[V]) resultOf(key string, v V, ok bool) (*result[V], error) {
	if !ok {
		return &result[V]{notFound: ErrNotFound}, nil
	}
	data, err := c.marshal(v)
	var pe *PanicError
	if errors.As(err, &pe) { // a broken codec, as when it panics decoding: the callers' error
		return nil, fmt.Errorf("cache: encode value for %q: %w", key, err)
	}
	if err != nil {
		// The value is good, only not storable: its callers get it.
		err = fmt.Errorf("cache: encode value for %q; it is returned but not stored: %w", key, err)
		c.cfg.emit(EventEncodeError, key, 0, err)
		if c.cfg.onError != nil && c.share.encodes.first(key) {
			c.cfg.onError(key, err)
		}
		return &result[V]{v: v, hasV: true, unencoded: true}, nil
	}
	return &result[V]{data: data}, nil
}

// lockEndFor is how k's lock ends after its load: the record to commit, or a
// release (no record) when there is nothing to store. st is the load's
// stamp (nil without WithTags): the value gets the call's, the loader's and
// the prior value's tags.
func (c *Cache[V]) lockEndFor(k loadKey, r *result[V], err error, opts *loadOptions, took time.Duration, st *record.Stamp) lockEnd {
	end := lockEnd{key: k.key, lk: k.lk}
	if st != nil {
		st = &record.Stamp{Clock: st.Clock, Tags: tags.Merge(opts.tags, k.priorTags())}
	}
	switch {
	case err != nil && k.fallback != nil: // stale-if-error: keep the old value for the throttle
		c.report(k.key, fmt.Errorf("cache: refresh of %q failed; its stale value is served for %v more: %w", k.key, c.cfg.throttle, err))
		fb := k.prior // the old value keeps the stamp it was current under
		if fb == nil && c.cfg.tags {
			fb = &record.Stamp{}
		}
		f := record.Freshness{Expiry: time.Now().Add(c.cfg.throttle), Load: took, TTL: k.kept} // its next refresh keeps the TTL too
		end.record, end.stamp = record.Build(record.FlagThrottled, f, fb, k.fallback), fb
		end.px = addSat(c.cfg.throttle, c.cfg.stale)
	case err != nil, opts.noCache, r.unencoded, r.notFound != nil && c.cfg.notFoundTTL == 0,
		r.notFound == nil && c.ttlFor(opts, k) <= 0:
		// released: callers merged with the load get it (see DoNotCache, TTL)
	case r.notFound != nil:
		end.record, end.px, end.stamp = record.Build(record.FlagNotFound, record.Freshness{}, st, nil), c.cfg.notFoundTTL, st
	default:
		end.record, end.px = c.wrap(r.data, took, c.ttlFor(opts, k), st)
		if opts.versioned {
			end.record = record.AddVersion(end.record, opts.version)
		}
		end.stamp = st
	}
	return end
}

// ttlFor is the TTL of k's new value: the loader's or the call's choice,
// else, for a refresh, the TTL its old value was stored with (a value
// stored with TTL(d) keeps d, whoever refreshes it), else the Cache's.
func (c *Cache[V]) ttlFor(opts *loadOptions, k loadKey) time.Duration {
	if k.kept > 0 {
		return opts.ttl.orDefault(k.kept)
	}
	return opts.ttl.orDefault(c.cfg.ttl)
}

// priorTags are the tags of the value k replaces.
func (k loadKey) priorTags() []string {
	if k.prior == nil {
		return nil
	}
	return k.prior.Tags
}

// wrap makes the record of a value loaded in took for a TTL of ttl (before
// jitter), stamped st (nil: not); px is how long Redis keeps it: the TTL
// plus what stale serving and early refresh need past it, and for a stamped
// record at most tagMemory. A TTL other than the Cache's is written in the
// record, for the value's refreshes to keep (see ttlFor).
func (c *Cache[V]) wrap(data []byte, took, ttl time.Duration, st *record.Stamp) (rec []byte, px time.Duration) {
	own := time.Duration(0)
	if ttl != c.cfg.ttl {
		own = ttl
	}
	ttl = c.jittered(ttl)
	if st != nil {
		ttl = min(ttl, tagMemory)
	}
	if !c.cfg.withFreshness() {
		return record.Build(0, record.Freshness{}, st, data), ttl
	}
	px = addSat(ttl, c.cfg.freshnessPolicy().KeepPast(took))
	if st != nil {
		px = min(px, tagMemory)
	}
	return record.Build(0, record.Freshness{Expiry: time.Now().Add(ttl), Load: took, TTL: own}, st, data), px
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

// lockEnd is the end of one held lock: its record committed (fenced), or
// the lock released when record is nil.
type lockEnd struct {
	key    string
	lk     *loadLock
	record []byte
	px     time.Duration
	stamp  *record.Stamp // record's (nil: none)
}

// releases gives up every lock of lks.
func releases(lks []*loadLock) []lockEnd {
	ends := make([]lockEnd, len(lks))
	for i, lk := range lks {
		ends[i] = lockEnd{key: lk.key, lk: lk}
	}
	return ends
}

// endLocks ends every lock of ends in one round: fenced by the lock's
// token, announced to waiters, transient cluster errors retried within the
// retry budget and the lock TTL (an abandoned lock would block every
// process for a whole lock TTL, so this outlives the flight's deadline).
// It returns, for each end, when the call that vouches for its value was
// sent (the commit that stored it, or the release that found the lock still
// ours, as for [DoNotCache]); zero when the lock was lost.
func (c *Cache[V]) endLocks(ctx context.Context, ends []lockEnd) []time.Time {
	stored := make([]time.Time, len(ends))
	if len(ends) == 0 {
		return stored
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.lockTTL)
	defer cancel()
	pending := make([]int, len(ends))
	for i := range pending {
		pending[i] = i
	}
	for attempt := 1; len(pending) > 0; attempt++ {
		var commits, releases []redisio.ScriptCall
		var ci, ri []int
		for _, i := range pending {
			e := ends[i]
			if e.record == nil {
				releases = append(releases, redisio.ScriptCall{Keys: e.lk.keys(), Args: []any{e.lk.token, "", c.notify.Channel(e.key)}})
				ri = append(ri, i)
			} else {
				commits = append(commits, redisio.ScriptCall{Keys: e.lk.keys(), Args: []any{e.lk.token, e.record, e.px.Milliseconds(), c.notify.Channel(e.key)}})
				ci = append(ci, i)
			}
		}
		at := time.Now()
		cmds := c.eval(ctx, redisio.ScriptRun{Script: commitScript, Src: commitLua, Calls: commits}, redisio.ScriptRun{Script: unlockScript, Src: unlockLua, Calls: releases})
		retry := c.readLockEnds(ends, append(ci, ri...), cmds, stored, at)
		if len(retry) > 0 && !c.cfg.retry.wait(ctx, attempt) {
			for i, err := range retry {
				c.report(ends[i].key, fmt.Errorf("cache: end lock of %q: %w", ends[i].key, err))
			}
			break
		}
		pending = slices.Sorted(maps.Keys(retry))
	}
	return stored
}

// readLockEnds reads one round of endLocks (cmds[j] ended ends[idx[j]], sent at
// at), marks what was stored and returns the ends to retry, with their
// errors.
func (c *Cache[V]) readLockEnds(ends []lockEnd, idx []int, cmds []*redis.Cmd, stored []time.Time, at time.Time) (retry map[int]error) {
	keys, errs := make([]string, len(cmds)), make([]error, len(cmds))
	for j, cmd := range cmds {
		keys[j], errs[j] = ends[idx[j]].key, cmd.Err()
	}
	for j, class := range c.round(keys, errs) {
		i, e := idx[j], ends[idx[j]]
		n, err := cmds[j].Int()
		switch {
		case class == errTransient:
			if retry == nil {
				retry = map[int]error{}
			}
			retry[i] = err
		case err != nil && e.record == nil:
			c.report(e.key, fmt.Errorf("cache: release lock of %q: %w", e.key, err))
		case err != nil:
			c.report(e.key, fmt.Errorf("cache: store %q: %w", e.key, err))
		case n == 0 && e.record != nil && e.lk.voided(c.cfg.lockTTL):
			c.cfg.emit(EventLoadVoided, e.key, 0, nil) // a write won over the load, as designed
		case n == 0 && e.record != nil:
			c.cfg.emit(EventLockLost, e.key, 0, ErrLoadLockLost)
			c.report(e.key, fmt.Errorf("cache: loaded value for %q not stored, its lock ran out (the holder was held up past the lock TTL): %w", e.key, ErrLoadLockLost))
		case n == 1: // stored, or released while still ours: no Delete or Set came between
			stored[i] = at
		}
	}
	return retry
}

// eval runs the calls of runs in one round (see evalMany); a single call
// goes alone, as redis.Script.Run sends it.
func (c *Cache[V]) eval(ctx context.Context, runs ...redisio.ScriptRun) []*redis.Cmd {
	var only *redisio.ScriptRun
	n := 0
	for i := range runs {
		if n += len(runs[i].Calls); len(runs[i].Calls) > 0 {
			only = &runs[i]
		}
	}
	if n == 1 {
		call := only.Calls[0]
		return []*redis.Cmd{only.Script.Run(ctx, c.rdb, call.Keys, call.Args...)}
	}
	if n == 0 {
		return nil
	}
	return c.redisio.EvalMany(ctx, runs[0].Script, runs[0].Src, runs[0].Calls, runs[1:]...)
}

// watchdog extends the locks of keys every lockTTL/3, in one round, until
// the returned stop is called, ctx ends or every lock is lost. stop waits
// for the goroutine to end.
func (c *Cache[V]) watchdog(ctx context.Context, keys []loadKey) (stop func()) {
	var live []loadKey
	for _, k := range keys {
		if k.lk != nil {
			live = append(live, k)
		}
	}
	if len(live) == 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.cfg.lockTTL / 3)
		defer t.Stop()
		for len(live) > 0 {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			live = c.extend(ctx, live)
		}
	})
	return func() { close(done); wg.Wait() }
}

// extend sets the lock TTL of every lock of live anew and returns those
// still held (a lost one was voided by a Delete or Set, or ran out).
func (c *Cache[V]) extend(ctx context.Context, live []loadKey) []loadKey {
	calls := make([]redisio.ScriptCall, len(live))
	keys := make([]string, len(live))
	for i, k := range live {
		calls[i] = redisio.ScriptCall{Keys: k.lk.keys(), Args: []any{k.lk.token, c.cfg.lockTTL.Milliseconds(), ""}}
		keys[i] = k.key
	}
	at := clock.Now()
	cmds := c.eval(ctx, redisio.ScriptRun{Script: unlockScript, Src: unlockLua, Calls: calls})
	errs := errsOf(cmds)
	c.round(keys, errs)
	kept := live[:0]
	for i, k := range live {
		switch err := ownerChecked(cmds[i]); {
		case err == nil:
			k.lk.renewed.Store(at)
			kept = append(kept, k)
		case !errors.Is(err, ErrLoadLockLost):
			kept = append(kept, k) // not extended: its TTL still runs from the last extension
		}
	}
	return kept
}

// addSat is a+b, saturating instead of overflowing for huge TTLs.
func addSat(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// jittered spreads d by the configured fraction, to at least 1ms and without
// overflowing for huge TTLs.
func (c *Cache[V]) jittered(d time.Duration) time.Duration {
	delta := time.Duration(c.cfg.jitter * (2*rand.Float64() - 1) * float64(d))
	return max(addSat(d, delta), time.Millisecond)
}
