// This file is GetOrLoadMany: the keys read in one pipelined round, the
// misses read-or-locked in a second, one loader call for every key this
// caller locked, and one fenced commit round; keys another holder is loading
// are waited for as GetOrLoad waits.

package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redisio"
)

// getOrLoadMany is GetOrLoadMany with its options read.
func (c *Cache[V]) getOrLoadMany(ctx context.Context, keys []string, loadMany loaderFunc[V], o callOptions) (map[string]V, error) {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return nil, err
	}
	if loadMany == nil {
		return nil, ErrNilLoader
	}
	if err := c.checkTags(o.store.tags); err != nil {
		return nil, err
	}
	b := &batch[V]{c: c, ctx: ctx, opts: o, loadMany: loadMany, name: make(map[string]string, len(keys))}
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
	b.readNear()
	if len(b.keys) == 0 {
		return b.vals, nil
	}
	if ctx.Done() == nil { // nothing can end this caller's wait: run inline
		b.run()
		return b.answer()
	}
	done := make(chan struct{})
	go func() { // ends with the batch's work, bounded by the load timeout and the lock TTL
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
	opts     callOptions
	loadMany loaderFunc[V]
	keys     []string          // full keys, deduplicated, in the caller's order
	name     map[string]string // full key to the caller's key

	held   []*heldKey            // the locks this call took and has not given up yet
	due    []due[V]              // values read that call for a refresh, not started yet
	late   []string              // keys the read-or-lock found, answered by takeLate
	misses map[string]verdict[V] // what the reads found at keys to reload (see verdict)
	// tickets are the near cache's tickets for keys, taken before any
	// read: a result is kept in memory only if no write of its key came
	// since (see near.keep). Read-only once run starts.
	tickets map[string]coherence.Ticket

	mu    sync.Mutex       // protects vals, errs and stale
	vals  map[string]V     // by the caller's key
	errs  map[string]error // by full key
	stale bool             // a stale value was returned
}

// heldKey is a key whose load lock this batch took, and the promise that its
// singleflight flight (if this batch leads it) waits on.
type heldKey struct {
	loadKey
	done chan struct{}
	r    any // *result[V], set before done is closed
	err  error
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

// readNear answers the keys memory holds, as GetOrLoad's first step does,
// and takes the tickets of the others, whose results memory then keeps.
func (b *batch[V]) readNear() {
	c := b.c
	if c.near == nil {
		return
	}
	o := b.opts
	remaining := b.keys[:0]
	for _, k := range b.keys {
		if !o.force && !o.noStale && !o.skipNear {
			if v, ok := c.nearGet(b.name[k], o.store.tags); ok {
				b.vals[b.name[k]] = v
				continue
			}
		}
		remaining = append(remaining, k)
	}
	b.keys = remaining
	b.tickets = make(map[string]coherence.Ticket, len(b.keys))
	for _, k := range b.keys {
		b.tickets[k] = c.nearTicket(k)
	}
}

// answerKey hands result r of key to the caller: its value, or nothing for a
// not-found; memory keeps it as GetOrLoad's does.
func (b *batch[V]) answerKey(key string, r *result[V]) {
	if b.c.near != nil {
		b.c.near.keep(b.c, key, b.tickets[key], r)
	}
	v, err := b.c.value(r)
	switch {
	case errors.Is(err, ErrNotFound):
		return
	case err != nil:
		b.fail(key, err)
		return
	}
	b.setValue(b.name[key], v, r.stale)
}

func (b *batch[V]) setValue(name string, v V, stale bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.vals[name] = v
	b.stale = b.stale || stale
}

// hit answers key's read r (nil: unreadable) as [Cache.judge] says,
// leaving the refreshes in b.due for b.refresh to start together, and what
// a miss found in b.misses for its reload. nil means a miss.
func (b *batch[V]) hit(key string, r *result[V]) *result[V] {
	v := b.c.judge(key, r, b.opts, true)
	switch {
	case v.due:
		b.due = append(b.due, due[V]{key: key, name: b.name[key], old: v.hit})
	case v.hit == nil:
		if b.misses == nil {
			b.misses = map[string]verdict[V]{}
		}
		b.misses[key] = v
	}
	return v.hit
}

// refresh starts the refreshes of b.due together (see refreshDue).
func (b *batch[V]) refresh(ctx context.Context) map[string]*result[V] {
	ds := b.due
	b.due = nil
	return b.c.refreshDue(ctx, ds, b.loadMany, b.opts.store)
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
	defer b.recoverPanic(ctx)

	if !c.brk.Allow() {
		var uncached []string
		for _, k := range b.keys {
			if b.outage(ctx, k, c.brk.Err()) {
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
		waits.Go(func() { b.waitFor(k) })
	}
	b.load(ctx, uncached)
	b.takeLate(ctx)
}

// recoverPanic, deferred by run, turns a panic into the error of every key not
// answered yet and gives up the locks still held.
func (b *batch[V]) recoverPanic(ctx context.Context) {
	p := recover()
	if p == nil {
		return
	}
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

// waitFor answers key, which another holder is loading, as GetOrLoad would.
func (b *batch[V]) waitFor(key string) {
	defer b.guard(key)
	name := b.name[key]
	v, err := b.c.getOrLoad(b.ctx, name, b.single(key), b.opts)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		b.fail(key, err)
	default:
		b.setValue(name, v, false)
	}
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
	tracked := c.redisio.Reads(ctx, b.keys, sent)
	errs := errsOf(cmds)
	classes := c.round(b.keys, errs)
	hits := make([]*result[V], len(b.keys))
	raws := make([][]byte, len(b.keys))
	for i := range b.keys {
		if errs[i] == nil && !b.opts.force {
			raws[i], _ = cmds[i].Bytes()
		}
	}
	current := c.tags.CurrentAll(ctx, raws)
	for i, k := range b.keys {
		if raws[i] != nil {
			hits[i] = b.hit(k, markTracked(c.decodeFor(k, raws[i], at, current), tracked[i]))
		}
	}
	refreshed := b.refresh(ctx)
	for i, class := range classes {
		k, err := b.keys[i], errs[i]
		switch verdictOf(class, err) {
		case readHit:
			if hits[i] != nil {
				if r := refreshed[k]; r != nil {
					hits[i] = r
				}
				b.answerKey(k, hits[i])
				continue
			}
			if skip == nil {
				skip = map[string][]byte{}
			}
			skip[k], _ = cmds[i].Bytes()
		case readMiss:
		case readFatal:
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
	calls := make([]redisio.ScriptCall, len(misses))
	lks := make([]*loadLock, len(misses))
	for i, k := range misses {
		lks[i] = newLoadLock(k)
		calls[i] = redisio.ScriptCall{Keys: lks[i].keys(), Args: []any{lks[i].token, c.cfg.lockTTL.Milliseconds(), skip[k]}}
	}
	at := time.Now()
	cmds := c.redisio.EvalMany(ctx, readOrLockScript, readOrLockLua, calls)
	errs := errsOf(cmds)
	var orphans []*loadLock
	for i, class := range c.round(misses, errs) {
		k := misses[i]
		switch step, found := lockStepOf(class, cmds[i]); step {
		case lockFound:
			queued := len(b.due)
			if r := b.hit(k, c.decode(b.ctx, k, found, at)); r == nil {
				others = append(others, k) // unreadable, or expired already: GetOrLoad's loop deals with it
			} else if len(b.due) > queued {
				b.late = append(b.late, k) // answered by takeLate, with its refresh
			} else {
				b.answerKey(k, r)
			}
		case lockTaken:
			b.hold(k, lks[i], at)
		case lockHeld, lockTransient:
			others = append(others, k)
		case lockFatal:
			b.fail(k, lockError(k, cmds[i]))
		default:
			orphans = append(orphans, lks[i])
			if b.outage(ctx, k, errs[i]) {
				lost = append(lost, k)
			}
		}
	}
	c.releaseLost(ctx, orphans...)
	return others, lost
}

// hold keeps lk, the load lock of key taken by a call sent at at, for the
// batch's load, and leads this process's flight of key, so that GetOrLoad
// callers of it share this load. If a flight already runs, it waits on the
// lock and is woken by the commit; nobody waits on h then.
func (b *batch[V]) hold(key string, lk *loadLock, at time.Time) {
	h := &heldKey{loadKey: b.misses[key].loadKey(key, b.name[key], lk, at), done: make(chan struct{})}
	b.held = append(b.held, h)
	b.c.group.DoChan(key, func() (any, error) {
		<-h.done
		return h.r, h.err
	})
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
	refreshed := b.refresh(ctx)
	for _, k := range b.late {
		r := olds[k]
		if f := refreshed[k]; f != nil {
			r = f
		}
		b.answerKey(k, r)
	}
	b.late = nil
}

// outage applies the failure policy to key (see Cache.outage): it reports
// true to load key uncached; otherwise key gets the error.
func (b *batch[V]) outage(ctx context.Context, key string, err error) bool {
	if err := b.c.outage(ctx, key, err); err != nil {
		b.fail(key, err)
		return false
	}
	return true
}

// load calls loadMany once for the held keys and uncached (keys Redis could
// not serve, under FailOpen) through the miss path's load (loadFor), and
// answers the caller and the flights waiting on the held keys.
func (b *batch[V]) load(ctx context.Context, uncached []string) {
	held := b.held
	keys := make([]loadKey, 0, len(held)+len(uncached))
	for _, h := range held {
		keys = append(keys, h.loadKey)
	}
	for _, k := range uncached {
		keys = append(keys, loadKey{key: k, name: b.name[k]})
	}
	if len(keys) == 0 {
		return
	}
	rs, errs := b.c.loadMisses(ctx, keys, b.loadMany, b.opts.store)
	b.held = nil
	for i, k := range keys {
		if errs[i] != nil {
			if i < len(held) {
				held[i].settle(nil, errs[i])
			}
			b.fail(k.key, errs[i])
			continue
		}
		if i < len(held) {
			held[i].settle(rs[i], nil)
		}
		b.answerKey(k.key, rs[i])
	}
}

// giveUp releases every lock the batch still holds and answers their
// flights with err.
func (b *batch[V]) giveUp(ctx context.Context, err error) {
	held := b.held
	b.held = nil
	lks := make([]*loadLock, len(held))
	for i, h := range held {
		lks[i] = h.lk
	}
	defer func() {
		for _, h := range held {
			h.settle(nil, err)
		}
	}()
	b.c.endLocks(ctx, releases(lks))
}

// round records one pipelined round's outcome: with the breaker once, as
// one call (an outage only if every command met one), and with the observer
// for each key whose command failed. It returns each command's class.
func (c *Cache[V]) round(keys []string, errs []error) []errClass {
	classes := make([]errClass, len(errs))
	outage := len(errs) > 0
	var first, full error
	for i, err := range errs {
		classes[i] = c.classify(err)
		if classes[i] != errOutage {
			outage = false
		}
		if classes[i] == errFull && full == nil {
			full = err
		}
		if classes[i] != errNone {
			c.cfg.emit(EventRedisError, keys[i], 0, err)
			if first == nil {
				first = err
			}
		}
	}
	class := errNone
	switch {
	case outage:
		class = errOutage
	case full != nil: // Redis is up but out of memory: health reports it once
		class, first = errFull, full
	}
	if len(keys) > 0 {
		c.brk.Record(keys[0], class, first)
	}
	return classes
}
