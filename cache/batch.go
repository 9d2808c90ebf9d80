// batch.go is GetOrLoadMany: the keys read in one pipelined round, the
// misses read-or-locked in a second, one loader call for every key this
// caller locked, and one fenced commit round; keys another holder is loading
// are waited for as GetOrLoad waits.

package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
)

// GetOrLoadMany returns the values at keys, as [Cache.GetOrLoad] would for
// each, with a few round trips for the whole batch instead of a few per key:
// one pipelined GET for all keys, one pipelined read-or-lock for the misses,
// one call of loadMany for the keys whose load lock this call took, and one
// pipelined fenced commit. loadMany receives only those keys (the caller's
// keys, without the prefix) and returns the values it found by key; a key it
// leaves out of the map does not exist: it is cached as not found for the
// not-found TTL (see [WithNotFoundTTL]) and left out of the result, as is a
// key whose not-found is already cached. [SetTTL] and [DoNotCache], called
// by loadMany, apply to every key of its call.
//
// Keys that another process (or a GetOrLoad flight of this one) is loading
// are waited for concurrently, each as GetOrLoad waits, and loaded by a
// single-key call of loadMany if that holder fails. While this call loads a
// key, concurrent GetOrLoad callers of the key in this process share its
// result instead of loading it again. Values due for early refresh or
// served stale are refreshed in the background together, by one more call
// of loadMany for those whose refresh this process starts and whose lock no
// other process holds (see [WithStale], [WithSoftLoadTimeout] and
// [WithEarlyRefresh]). Duplicate keys are read and returned once.
//
// The work runs on ctx's values without its cancellation, bounded by
// [WithLoadTimeout]; when ctx ends first, GetOrLoadMany returns nil and
// ctx.Err() at once, the loads going on and being stored for later callers.
//
// opts change this call only: a [TTL] applies to every value loadMany
// returns (the other [CallOption]s do not apply to batches). A ctx already
// ended returns ctx.Err() at once, without a Redis call or a load.
//
// The result holds every value found or loaded. The error, nil when every
// key was answered, joins one error per failed key on one line
// ("; "-separated), each naming its key, each matched with errors.Is and
// errors.As as GetOrLoad's: loadMany's own error (for each key
// it was given; nothing is cached), [ErrLockNotAcquired], a Redis error
// under [FailClosed] or [ErrCircuitOpen]. Under [FailOpen], keys Redis could
// not serve are loaded by the same loadMany call and returned uncached.
// Errors before any work, with a nil map: [ErrNilLoader], and
// [ErrEmptyKey] or [ErrReservedKey] naming the key's index. With [WithResultInfo], Stale is set when
// any value returned was stale. Safe for concurrent use.
func (c *Cache[V]) GetOrLoadMany(ctx context.Context, keys []string, loadMany func(ctx context.Context, keys []string) (map[string]V, error), opts ...CallOption) (map[string]V, error) {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return nil, err
	}
	ctx, _ = withCall(ctx, opts)
	if loadMany == nil {
		return nil, ErrNilLoader
	}
	b := &batch[V]{c: c, ctx: ctx, loadMany: loadMany, name: make(map[string]string, len(keys))}
	for i, k := range keys {
		full, err := c.key(k)
		if err != nil {
			return nil, under(fmt.Sprintf("cache: GetOrLoadMany: keys[%d]", i), err)
		}
		if _, dup := b.name[full]; !dup {
			b.name[full] = k
			b.keys = append(b.keys, full)
		}
	}
	b.vals = make(map[string]V, len(b.keys))
	if len(b.keys) == 0 {
		return b.vals, nil
	}
	if ctx.Done() == nil { // nothing can end this caller's wait: run inline
		b.run()
		return b.answer()
	}
	done := make(chan struct{})
	go func() { // ends with the batch's work, bounded by the load timeout and the lease
		defer close(done)
		b.run()
	}()
	select {
	case <-done:
		return b.answer()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// batch is one GetOrLoadMany call's shared work. run's goroutine owns it,
// but for vals, errs and stale, which the waits on other holders also write.
type batch[V any] struct {
	c        *Cache[V]
	ctx      context.Context // the caller's: its values, and the end of its waits for other holders
	loadMany func(context.Context, []string) (map[string]V, error)
	keys     []string          // full keys, deduplicated, in the caller's order
	name     map[string]string // full key to the caller's key

	held []*heldKey // the locks this call took and has not given up yet
	due  []due[V]   // values read that call for a refresh, not started yet
	late []string   // keys the read-or-lock found, answered by takeLate

	mu    sync.Mutex       // protects vals, errs and stale
	vals  map[string]V     // by the caller's key
	errs  map[string]error // by full key
	stale bool             // a stale value was returned
}

// heldKey is a key whose load lock this batch took, and the promise that its
// singleflight flight (if this batch leads it) waits on.
type heldKey struct {
	key    string
	lk     *loadLock
	locked time.Time // when the read-or-lock that took it was sent
	done   chan struct{}
	r      any // *result[V], set before done is closed
	err    error
}

// settle answers the flight waiting on h, once.
func (h *heldKey) settle(r any, err error) {
	select {
	case <-h.done:
	default:
		h.r, h.err = r, err
		close(h.done)
	}
}

// answer is the caller's view of a finished batch.
func (b *batch[V]) answer() (map[string]V, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stale {
		markStale(b.ctx)
	}
	var names, full []string
	var errs []error
	for _, k := range b.keys {
		if err := b.errs[k]; err != nil {
			names, full, errs = append(names, b.name[k]), append(full, k), append(errs, err)
		}
	}
	return b.vals, joinKeys(names, full, errs)
}

func (b *batch[V]) fail(key string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.errs == nil {
		b.errs = map[string]error{}
	}
	b.errs[key] = err
}

// take hands result r of key to the caller: its value, or nothing for a
// not-found.
func (b *batch[V]) take(key string, r *result[V]) {
	v, err := b.c.value(r)
	switch {
	case errors.Is(err, ErrNotFound):
		return
	case err != nil:
		b.fail(key, err)
		return
	}
	b.put(b.name[key], v, r.stale)
}

func (b *batch[V]) put(name string, v V, stale bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.vals[name] = v
	b.stale = b.stale || stale
}

// hit answers key's read r (nil: unreadable) as [Cache.found] does, but
// for the refreshes, which it leaves in b.due for b.refresh to start
// together. nil means a miss.
func (b *batch[V]) hit(key string, r *result[V]) *result[V] {
	c := b.c
	if r == nil || r.err != nil {
		return r
	}
	switch c.cfg.ageOf(r.fresh, r.throttled, r.at, r.head) {
	case ageFresh:
	case ageRefresh:
		b.due = append(b.due, due[V]{key: key, name: b.name[key], old: r})
	case ageStale:
		r.stale = true
		if r.throttled && r.at.Before(r.fresh.Expiry) { // its refresh failed: retried once the throttle ends
			c.cfg.emit(EventStaleServed, key, 0, ErrRefreshFailed)
		} else {
			b.due = append(b.due, due[V]{key: key, name: b.name[key], old: r}) // EventStaleServed once it is known how
		}
		return r
	default:
		return nil
	}
	c.cfg.emit(EventHit, key, 0, nil)
	return r
}

// refresh starts the refreshes of b.due in one background call of
// loadMany and, as [Cache.serveStale] does for one key, waits up to the
// soft load timeout for it when a stale value is among them: once for the
// batch, not once per key. It returns the fresh results that replace stale
// values, by key, and reports the stale values served.
func (b *batch[V]) refresh(ctx context.Context) map[string]*result[V] {
	c, ds := b.c, b.due
	b.due = nil
	if len(ds) == 0 {
		return nil
	}
	started, done := c.refreshMany(ctx, ds, b.loadMany)
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
	fresh := map[string]*result[V]{}
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
			fresh[d.key] = r
			continue
		default:
			why = ErrRefreshFailed
		}
		c.cfg.emit(EventStaleServed, d.key, 0, why)
	}
	return fresh
}

// single is loadMany for one key, for waits on other holders that end up
// loading.
func (b *batch[V]) single(key string) func(context.Context) (V, error) {
	name := b.name[key]
	return func(ctx context.Context) (V, error) {
		m, err := b.loadMany(ctx, []string{name})
		v, ok := m[name]
		switch {
		case err != nil:
			var zero V
			return zero, err
		case !ok:
			return v, ErrNotFound
		}
		return v, nil
	}
}

// run is the batch's work, on the caller's values without its
// cancellation, bounded by the load timeout. Every flight it leads is
// answered and every lock it holds given up (or committed) before it
// returns, whatever happens.
func (b *batch[V]) run() {
	c := b.c
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), c.cfg.loadTimeout)
	defer cancel()
	var waits sync.WaitGroup
	defer waits.Wait()
	defer func() {
		if p := recover(); p != nil {
			err := &PanicError{in: "batch", Value: p, stack: debug.Stack()}
			for _, k := range b.keys {
				b.mu.Lock()
				_, answered := b.vals[b.name[k]]
				b.mu.Unlock()
				if !answered {
					b.fail(k, err)
				}
			}
			b.giveUp(ctx, err)
		}
	}()

	if !c.brk.allow() {
		var uncached []string
		for _, k := range b.keys {
			if b.outage(ctx, k, c.brk.err()) {
				uncached = append(uncached, k)
			}
		}
		b.load(ctx, uncached)
		return
	}
	misses, skip, uncached := b.read(ctx)
	if len(misses) == 0 && len(uncached) == 0 {
		return
	}
	others, lost := b.readOrLock(ctx, misses, skip)
	uncached = append(uncached, lost...)
	for _, k := range others {
		waits.Go(func() {
			defer b.guard(k)
			name := b.name[k]
			v, err := c.GetOrLoad(b.ctx, name, b.single(k))
			switch {
			case errors.Is(err, ErrNotFound):
			case err != nil:
				b.fail(k, err)
			default:
				b.put(name, v, false)
			}
		})
	}
	b.load(ctx, uncached)
	b.takeLate(ctx)
}

// guard, deferred by a goroutine of the batch working on key, turns a
// panic into key's error instead of a crash of the process.
func (b *batch[V]) guard(key string) {
	if p := recover(); p != nil {
		b.fail(key, &PanicError{in: "batch", Value: p, stack: debug.Stack()})
	}
}

// read is the pipelined GET of every key. Hits are answered; it returns
// the misses (with the bytes found at those it could not use, which the
// read-or-lock treats as absent) and, under FailOpen, the keys Redis could
// not serve, to load uncached.
func (b *batch[V]) read(ctx context.Context) (misses []string, skip map[string][]byte, uncached []string) {
	c := b.c
	at := time.Now()
	cmds := make([]*redis.StringCmd, len(b.keys))
	sent := make([]redis.Cmder, len(b.keys))
	for i, k := range b.keys {
		cmds[i] = redis.NewStringCmd(ctx, "get", k)
		sent[i] = cmds[i]
	}
	c.pipeline(ctx, b.keys, sent)
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
	}
	classes := c.round(b.keys, errs)
	hits := make([]*result[V], len(b.keys))
	for i, k := range b.keys {
		if errs[i] == nil {
			raw, _ := cmds[i].Bytes()
			hits[i] = b.hit(k, c.decode(k, raw, at))
		}
	}
	fresh := b.refresh(ctx)
	for i, class := range classes {
		k, err := b.keys[i], errs[i]
		switch {
		case err == nil:
			if hits[i] != nil {
				if r := fresh[k]; r != nil {
					hits[i] = r
				}
				b.take(k, hits[i])
				continue
			}
			if skip == nil {
				skip = map[string][]byte{}
			}
			skip[k], _ = cmds[i].Bytes()
		case errors.Is(err, redis.Nil), isWrongType(err), class == errTransient:
		case class == errFatal:
			b.fail(k, fmt.Errorf("cache: redis: %w", err))
			continue
		default:
			if b.outage(ctx, k, err) {
				uncached = append(uncached, k)
			}
			continue
		}
		c.cfg.emit(EventMiss, k, 0, nil)
		misses = append(misses, k)
	}
	return misses, skip, uncached
}

// readOrLock is the pipelined read-or-lock of the misses. Values that
// appeared are answered; the locks taken are held (b.held), each key's
// flight in this process led by the batch; it returns the keys another
// holder is loading (or that a transient error or an unreadable value kept
// from an answer), to wait for, and the keys Redis could not serve.
func (b *batch[V]) readOrLock(ctx context.Context, misses []string, skip map[string][]byte) (others, lost []string) {
	c := b.c
	calls := make([]scriptCall, len(misses))
	lks := make([]*loadLock, len(misses))
	for i, k := range misses {
		lks[i] = newLoadLock(k)
		calls[i] = scriptCall{lks[i].keys(), []any{lks[i].token, c.cfg.lockTTL.Milliseconds(), skip[k]}}
	}
	at := time.Now()
	cmds := c.evalMany(ctx, readOrLockScript, readOrLockLua, calls)
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
	}
	var orphans []*loadLock
	for i, class := range c.round(misses, errs) {
		k := misses[i]
		switch class {
		case errNone:
		case errTransient: // a slot migrating, a failover: wait it out as GetOrLoad does
			others = append(others, k)
			continue
		case errFatal:
			b.fail(k, fmt.Errorf("cache: redis: %w", errs[i]))
			continue
		default:
			orphans = append(orphans, lks[i]) // ours if only the reply was lost
			if b.outage(ctx, k, errs[i]) {
				lost = append(lost, k)
			}
			continue
		}
		res, err := cmds[i].Slice()
		switch {
		case err != nil || len(res) != 2:
			b.fail(k, fmt.Errorf("cache: redis: read-or-lock of %q: unexpected reply %v (%v)", k, res, err))
		case res[0] == int64(1):
			s, _ := res[1].(string)
			queued := len(b.due)
			if r := b.hit(k, c.decode(k, []byte(s), at)); r == nil {
				others = append(others, k) // unreadable, or expired already: GetOrLoad's loop deals with it
			} else if len(b.due) > queued {
				b.late = append(b.late, k) // answered by takeLate, with its refresh
			} else {
				b.take(k, r)
			}
		case res[1] == int64(1):
			h := &heldKey{key: k, lk: lks[i], locked: at, done: make(chan struct{})}
			b.held = append(b.held, h)
			// Lead this process's flight of k, so that GetOrLoad callers of k
			// share this load. If a flight already runs, it waits on the lock
			// and is woken by the commit; nobody waits on h then.
			c.group.DoChan(k, func() (any, error) {
				<-h.done
				return h.r, h.err
			})
		default:
			others = append(others, k)
		}
	}
	if len(orphans) > 0 {
		// Released in the background, as GetOrLoad does: on a stalled Redis a
		// second round trip would double the wait before the failure policy
		// applies. The goroutine ends with the release, bounded by the lease.
		go c.releaseMany(ctx, orphans)
	}
	return others, lost
}

// takeLate answers the values the read-or-lock found that call for a
// refresh (rarely: they were written since the read), after the batch's
// loads are committed, so that a wait for their refresh (the soft load
// timeout) does not hold the batch's locks: one more refresh call for them.
func (b *batch[V]) takeLate(ctx context.Context) {
	olds := make(map[string]*result[V], len(b.due))
	for _, d := range b.due {
		olds[d.key] = d.old
	}
	fresh := b.refresh(ctx)
	for _, k := range b.late {
		r := olds[k]
		if f := fresh[k]; f != nil {
			r = f
		}
		b.take(k, r)
	}
	b.late = nil
}

// outage applies the failure policy to key, which Redis could not serve
// (err: the Redis error, or ErrCircuitOpen): under FailOpen, while the load
// timeout allows, it reports true, to load key uncached; otherwise key gets
// the error.
func (b *batch[V]) outage(ctx context.Context, key string, err error) bool {
	if !errors.Is(err, ErrCircuitOpen) {
		err = fmt.Errorf("cache: redis: %w", err)
	}
	if ctx.Err() != nil || b.c.cfg.policy == FailClosed {
		b.fail(key, err)
		return false
	}
	if !errors.Is(err, ErrCircuitOpen) { // an open breaker is reported once, as EventBreakerOpen
		b.c.report(key, err)
	}
	return true
}

// load calls loadMany once for the held keys and uncached (keys Redis could
// not serve, under FailOpen), then commits or releases every held lock and
// answers the flights waiting on them.
func (b *batch[V]) load(ctx context.Context, uncached []string) {
	c := b.c
	held := b.held
	keys := make([]string, 0, len(held)+len(uncached))
	names := make([]string, 0, cap(keys))
	for _, h := range held {
		keys = append(keys, h.key)
	}
	keys = append(keys, uncached...)
	if len(keys) == 0 {
		return
	}
	for _, k := range keys {
		names = append(names, b.name[k])
	}
	stop := c.batchWatchdog(ctx, held)
	opts := newLoadOptions(ctx)
	began := time.Now()
	m, err := callLoader(context.WithValue(ctx, loadOptionsKey{}, opts), func(ctx context.Context) (map[string]V, error) {
		return b.loadMany(ctx, names)
	})
	took := time.Since(began)
	c.cfg.emit(EventLoad, keys[0], took, err)
	stop()
	if err != nil {
		for _, k := range keys {
			b.fail(k, err)
		}
		b.giveUp(ctx, err)
		return
	}
	for _, k := range uncached {
		if v, ok := m[b.name[k]]; ok {
			b.put(b.name[k], v, false)
		}
	}

	ttl := c.cfg.ttl
	if opts.ttl > 0 {
		ttl = opts.ttl
	}
	ops := make([]lockOp, len(held))
	rs := make([]*result[V], len(held))
	for i, h := range held {
		ops[i] = lockOp{key: h.key, lk: h.lk}
		v, ok := m[b.name[h.key]]
		var err error
		if ok {
			rs[i], err = c.outcome(h.key, v, nil)
		} else {
			rs[i] = &result[V]{notFound: ErrNotFound}
		}
		switch {
		case err != nil: // the codec refused the value: nothing cached, an error for its callers
			h.err = err
		case opts.noCache, rs[i].notFound != nil && c.cfg.notFoundTTL == 0:
		case rs[i].notFound != nil:
			ops[i].record, ops[i].px = record.Encode(record.FlagNotFound, nil), c.cfg.notFoundTTL
		default:
			ops[i].record, ops[i].px = c.record(rs[i].data, took, ttl)
		}
	}
	stored := c.commitMany(ctx, ops)
	b.held = nil
	for i, h := range held {
		if h.err != nil {
			b.fail(h.key, h.err)
			h.settle(nil, h.err)
			continue
		}
		rs[i].at = h.locked
		if !stored[i].IsZero() {
			rs[i].at = stored[i]
		}
		h.settle(rs[i], nil)
		b.take(h.key, rs[i])
	}
}

// giveUp releases every lock the batch still holds and answers their
// flights with err.
func (b *batch[V]) giveUp(ctx context.Context, err error) {
	held := b.held
	b.held = nil
	ops := make([]lockOp, len(held))
	for i, h := range held {
		ops[i] = lockOp{key: h.key, lk: h.lk}
	}
	defer func() {
		for _, h := range held {
			h.settle(nil, err)
		}
	}()
	b.c.commitMany(ctx, ops)
}

// lockOp is the end of one held lock: its record committed (fenced), or
// the lock released when record is nil.
type lockOp struct {
	key    string
	lk     *loadLock
	record []byte
	px     time.Duration
}

// commitMany ends every lock of ops in one pipelined round, as commit and
// release do for one: fenced by the lock's token, announced to waiters,
// transient cluster errors retried within the retry budget and the lease.
// It returns, for each op, when the call that vouches for its value was
// sent (the commit that stored it, or the release that found the lock still
// ours, as for [DoNotCache]); zero when the lock was lost.
func (c *Cache[V]) commitMany(ctx context.Context, ops []lockOp) []time.Time {
	stored := make([]time.Time, len(ops))
	if len(ops) == 0 {
		return stored
	}
	ctx, cancel := c.cleanup(ctx)
	defer cancel()
	pending := make([]int, len(ops))
	for i := range pending {
		pending[i] = i
	}
	for attempt := 1; len(pending) > 0; attempt++ {
		var commits, releases []scriptCall
		var ci, ri []int
		for _, i := range pending {
			op := ops[i]
			if op.record == nil {
				releases = append(releases, scriptCall{op.lk.keys(), []any{op.lk.token, "", c.notify.channel(op.key)}})
				ri = append(ri, i)
			} else {
				commits = append(commits, scriptCall{op.lk.keys(), []any{op.lk.token, op.record, op.px.Milliseconds(), c.notify.channel(op.key)}})
				ci = append(ci, i)
			}
		}
		at := time.Now()
		cmds := c.evalMany(ctx, commitScript, commitLua, commits, scriptRun{unlockScript, unlockLua, releases})
		idx := append(ci, ri...)
		keys, errs := make([]string, len(cmds)), make([]error, len(cmds))
		for j, cmd := range cmds {
			keys[j], errs[j] = ops[idx[j]].key, cmd.Err()
		}
		var retry []int
		last := map[int]error{}
		for j, class := range c.round(keys, errs) {
			i, op := idx[j], ops[idx[j]]
			n, err := cmds[j].Int()
			switch {
			case class == errTransient:
				retry = append(retry, i)
				last[i] = err
			case err != nil && op.record == nil:
				c.report(op.key, fmt.Errorf("cache: release lock of %q: %w", op.key, err))
			case err != nil:
				c.report(op.key, fmt.Errorf("cache: store %q: %w", op.key, err))
			case n == 0 && op.record != nil:
				c.cfg.emit(EventLockLost, op.key, 0, ErrLoadLockLost)
				c.report(op.key, fmt.Errorf("cache: loaded value for %q not stored, the lock was lost: %w", op.key, ErrLoadLockLost))
			case n == 1: // stored, or released while still ours: no Delete or Set came between
				stored[i] = at
			}
		}
		if len(retry) > 0 && !c.cfg.retry.wait(ctx, attempt) {
			for _, i := range retry {
				c.report(ops[i].key, fmt.Errorf("cache: end lock of %q: %w", ops[i].key, last[i]))
			}
			break
		}
		pending = retry
	}
	return stored
}

// releaseMany gives up locks that may be ours (a read-or-lock whose reply
// was lost), in one pipelined round.
func (c *Cache[V]) releaseMany(ctx context.Context, lks []*loadLock) {
	ops := make([]lockOp, len(lks))
	for i, lk := range lks {
		ops[i] = lockOp{key: lk.key, lk: lk}
	}
	c.commitMany(ctx, ops)
}

// batchWatchdog extends every lock of held every lockTTL/3, in one
// pipelined round, until the returned stop is called, ctx ends or every
// lock is lost. stop waits for the goroutine to end.
func (c *Cache[V]) batchWatchdog(ctx context.Context, held []*heldKey) (stop func()) {
	if len(held) == 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.cfg.lockTTL / 3)
		defer t.Stop()
		live := append([]*heldKey(nil), held...)
		for len(live) > 0 {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			calls := make([]scriptCall, len(live))
			keys := make([]string, len(live))
			for i, h := range live {
				calls[i] = scriptCall{h.lk.keys(), []any{h.lk.token, c.cfg.lockTTL.Milliseconds(), ""}}
				keys[i] = h.key
			}
			cmds := c.evalMany(ctx, unlockScript, unlockLua, calls)
			errs := make([]error, len(cmds))
			for i, cmd := range cmds {
				errs[i] = cmd.Err()
			}
			c.round(keys, errs)
			kept := live[:0]
			for i, h := range live {
				if !errors.Is(ownerChecked(cmds[i]), ErrLoadLockLost) {
					kept = append(kept, h) // lost: a Delete or Set voided it, or the lease ran out
				}
			}
			live = kept
		}
	})
	return func() { close(done); wg.Wait() }
}

// scriptCall is one run of a script: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// scriptRun is the runs of one script in a pipelined round.
type scriptRun struct {
	script *redis.Script
	src    string
	calls  []scriptCall
}

// evalMany runs script (whose source is src) once per call, and the runs
// of more scripts after them, in one pipeline, with EVALSHA. Calls that find
// the script missing (NOSCRIPT) are sent again once after SCRIPT LOAD (on
// every master of a cluster), and with EVAL if still missing (a redis.Ring
// loads scripts on one shard only). It returns the commands in order.
func (c *Cache[V]) evalMany(ctx context.Context, script *redis.Script, src string, calls []scriptCall, more ...scriptRun) []*redis.Cmd {
	runs := append([]scriptRun{{script, src, calls}}, more...)
	type ref struct {
		run  *scriptRun
		call scriptCall
	}
	var refs []ref
	for i := range runs {
		for _, call := range runs[i].calls {
			refs = append(refs, ref{&runs[i], call})
		}
	}
	cmds := make([]*redis.Cmd, len(refs))
	if len(refs) == 0 {
		return cmds
	}
	send := func(idx []int, eval bool) {
		keys, sent := make([]string, len(idx)), make([]redis.Cmder, len(idx))
		for j, i := range idx {
			r := refs[i]
			args := []any{"evalsha", r.run.script.Hash(), len(r.call.keys)}
			if eval {
				args[0], args[1] = "eval", r.run.src
			}
			for _, k := range r.call.keys {
				args = append(args, k)
			}
			cmds[i] = redis.NewCmd(ctx, append(args, r.call.args...)...)
			keys[j], sent[j] = r.call.keys[0], cmds[i]
		}
		c.pipeline(ctx, keys, sent)
	}
	noScript := func() (idx []int, scripts map[*scriptRun]bool) {
		scripts = map[*scriptRun]bool{}
		for i, cmd := range cmds {
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				idx = append(idx, i)
				scripts[refs[i].run] = true
			}
		}
		return idx, scripts
	}
	all := make([]int, len(refs))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	again, scripts := noScript()
	if len(again) == 0 {
		return cmds
	}
	for r := range scripts {
		if err := r.script.Load(ctx, c.rdb).Err(); err != nil {
			for _, i := range again {
				if refs[i].run == r {
					cmds[i].SetErr(err)
				}
			}
		}
	}
	send(again, false)
	if again, _ = noScript(); len(again) > 0 {
		send(again, true)
	}
	return cmds
}

// round records one pipelined round's outcome: with the breaker once, as
// one call (an outage only if every command met one), and with the observer
// for each key whose command failed. It returns each command's class.
func (c *Cache[V]) round(keys []string, errs []error) []errClass {
	classes := make([]errClass, len(errs))
	outage := len(errs) > 0
	var first error
	for i, err := range errs {
		classes[i] = c.classify(err)
		if classes[i] != errOutage {
			outage = false
		}
		if classes[i] != errNone {
			c.cfg.emit(EventRedisError, keys[i], 0, err)
			if first == nil {
				first = err
			}
		}
	}
	class := errNone
	if outage {
		class = errOutage
	}
	switch c.brk.record(class, first) {
	case +1:
		c.cfg.emit(EventBreakerOpen, keys[0], 0, first)
	case -1:
		c.cfg.emit(EventBreakerClose, keys[0], 0, nil)
	}
	return classes
}

// pipeline sends cmds in one round; keys[i] is a key of cmds[i], all of
// whose keys are in one slot. On a cluster it does not use
// ClusterClient.Pipelined: that races with itself (two goroutines write one
// command's reply) when a node's part meets TRYAGAIN on one command and ASK
// on another while a slot migrates (see RELIABILITY.md). Instead each
// master's commands go through its own client in one pipeline, the masters
// concurrently, and the cache follows MOVED and ASK itself; TRYAGAIN is
// left to the callers, which wait it out within the retry budget as they do
// every transient error. Hooks added to the ClusterClient itself do not see
// these pipelines; hooks added to its nodes (OnNewNode) do.
func (c *Cache[V]) pipeline(ctx context.Context, keys []string, cmds []redis.Cmder) {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				_ = p.Process(ctx, cmd)
			}
			return nil
		})
		unsent(cmds, err)
		return
	}
	var nodes map[string]*redis.Client // by address, for redirects; filled on the first
	to := make([]*redis.Client, len(cmds))
	asking := make([]bool, len(cmds))
	pending := make([]int, 0, len(cmds))
	for i := range cmds {
		node, err := cc.MasterForKey(ctx, keys[i])
		if err != nil {
			cmds[i].SetErr(err)
			continue
		}
		to[i] = node
		pending = append(pending, i)
	}
	for hop := 0; len(pending) > 0; hop++ {
		byNode := map[*redis.Client][]int{}
		for _, i := range pending {
			byNode[to[i]] = append(byNode[to[i]], i)
		}
		var wg sync.WaitGroup
		for node, idx := range byNode {
			wg.Go(func() { nodePipeline(ctx, node, cmds, idx, asking) })
		}
		wg.Wait()
		if hop == maxRedirects {
			return // what is still redirected is a transient error for the callers
		}
		var again []int
		for _, i := range pending {
			err := cmds[i].Err()
			moved := redis.HasErrorPrefix(err, "MOVED")
			if !moved && !redis.HasErrorPrefix(err, "ASK") {
				continue
			}
			if moved {
				cc.ReloadState(ctx)
			}
			if nodes == nil {
				nodes = clusterNodes(ctx, cc)
			}
			f := strings.Fields(err.Error()) // MOVED|ASK slot host:port
			if len(f) < 3 || nodes[f[2]] == nil {
				continue // a node this client does not know yet: the callers retry
			}
			to[i], asking[i] = nodes[f[2]], !moved
			again = append(again, i)
		}
		pending = again
	}
}

// maxRedirects bounds how often one pipeline follows MOVED and ASK.
const maxRedirects = 3

// nodePipeline sends cmds[idx] to node in one pipeline, each command with
// asking set preceded by ASKING (which holds for the next command only).
func nodePipeline(ctx context.Context, node *redis.Client, cmds []redis.Cmder, idx []int, asking []bool) {
	sent := make([]redis.Cmder, 0, len(idx))
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range idx {
			if asking[i] {
				_ = p.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
			}
			_ = p.Process(ctx, cmds[i])
			sent = append(sent, cmds[i])
		}
		return nil
	})
	unsent(sent, err)
}

// unsent gives err, the error of a pipeline, to its commands that got no
// reply: go-redis before v9.7 leaves the commands of a pipeline it could
// not send untouched.
func unsent(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, cmd := range cmds {
		switch cmd := cmd.(type) {
		case *redis.Cmd:
			if cmd.Err() == nil && cmd.Val() == nil {
				cmd.SetErr(err)
			}
		case *redis.StringCmd:
			if cmd.Err() == nil && cmd.Val() == "" {
				cmd.SetErr(err)
			}
		}
	}
}

// clusterNodes returns the clients of cc's nodes by address.
func clusterNodes(ctx context.Context, cc *redis.ClusterClient) map[string]*redis.Client {
	var mu sync.Mutex
	nodes := map[string]*redis.Client{}
	_ = cc.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes[node.Options().Addr] = node
		return nil
	})
	return nodes
}
