// This file is Set and Delete: the write, which voids any load in flight,
// and its confirmation by the near caches of every process (see
// internal/coherence).

package cache

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/tags"
)

var (
	//go:embed scripts/set.lua
	setLua    string
	setScript = redis.NewScript(setLua)

	//go:embed scripts/expire.lua
	expireLua    string
	expireScript = redis.NewScript(expireLua)
)

// set is Set with its options read.
func (c *Cache[V]) set(ctx context.Context, key string, v V, o callOptions) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	if err := c.checkTags(o.store.tags); err != nil {
		return err
	}
	ttl := o.store.ttl.orDefault(c.cfg.ttl)
	if ttl <= 0 { // already expired: the older value must not stay either
		return c.delete(ctx, []string{key})
	}
	key, err := c.key(key)
	if err != nil {
		return err
	}
	st, err := c.tags.Stamp(ctx, tags.Merge(o.store.tags, nil)) // behind the breaker (see guardTags)
	if err != nil {
		return err
	}
	if !c.brk.Allow() { // after the stamp: a read of the clock may have been the probe
		return c.brk.Err()
	}
	data, err := c.marshal(v)
	if err != nil {
		return fmt.Errorf("cache: encode value for %q: %w", key, err)
	}
	defer c.group.Forget(key) // later callers must not join a flight that began before the write
	defer c.nearDrop(key)
	rec, px := c.wrap(data, 0, ttl, st)
	var version []byte // "": any value is replaced
	if o.store.versioned {
		rec, version = record.AddVersion(rec, o.store.version), record.VersionBytes(o.store.version)
	}
	keys, args := []string{key, LockKey(key)}, []any{rec, px.Milliseconds(), c.notify.Channel(key), version}
	var reply *redis.Cmd // the last attempt's
	err = c.writeConfirmed(ctx, []string{key}, setScript,
		func(p redis.Pipeliner) { reply = setScript.EvalSha(ctx, p, keys, args...) },
		func() error { reply = setScript.Run(ctx, c.rdb, keys, args...); return reply.Err() })
	if err == nil && reply != nil && reply.Val() == int64(0) {
		// Refused, yet after the confirmation: the newer value's own Set
		// may not have been acknowledged yet, and a read after this one
		// returns must not find older memory anywhere.
		return fmt.Errorf("cache: set %q at version %d: %w", key, o.store.version, ErrOlderVersion)
	}
	return err
}

// delete is Delete.
func (c *Cache[V]) delete(ctx context.Context, keys []string) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	full := make([]string, len(keys))
	for i, k := range keys {
		k, err := c.key(k)
		if err != nil {
			return err
		}
		full[i] = k
	}
	if !c.brk.Allow() {
		return c.brk.Err()
	}
	defer func() {
		c.nearDrop(full...)
		for _, k := range full {
			c.group.Forget(k) // later callers must not join a flight that began before the delete
		}
	}()
	return c.writeConfirmed(ctx, full, nil,
		func(p redis.Pipeliner) { delCmds(ctx, p, full) },
		func() error { return c.del(ctx, full) })
}

// del removes keys and their locks: on a cluster with single-key commands,
// locks first, so that a holder cannot commit between the two; elsewhere
// with one DEL per key, which a redis.Ring routes by the value key, where
// the lock lives.
func (c *Cache[V]) del(ctx context.Context, keys []string) error {
	pipe := func(fn func(p redis.Pipeliner)) error {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error { fn(p); return nil })
		return err
	}
	if c.cluster {
		if err := pipe(func(p redis.Pipeliner) {
			for _, k := range keys {
				p.Del(ctx, LockKey(k))
			}
		}); err != nil {
			return err
		}
		return pipe(func(p redis.Pipeliner) {
			for _, k := range keys {
				p.Del(ctx, k)
			}
		})
	}
	return pipe(func(p redis.Pipeliner) { delCmds(ctx, p, keys) })
}

// delCmds deletes keys with their locks, one DEL per key (which a Ring
// routes by the value key, where the lock lives).
func delCmds(ctx context.Context, p redis.Pipeliner, keys []string) {
	for _, k := range keys {
		p.Del(ctx, k, LockKey(k))
	}
}

// writeConfirmed runs a write of keys (keys[0] names it in errors) within
// the retry budget and, on a client the near cache supports, with or
// without a near cache in this process, its confirmation
// (coherence.Tracker.Write): on a single server the write's commands
// (pipe) and the confirmation in one pipeline, elsewhere the write
// (direct) and then the confirmation. Once the write is done, this
// process's memory drops keys before the wait for the others. script is
// the one pipe runs by hash (nil: none): a server that lost it (SCRIPT
// FLUSH, a restart) answers NOSCRIPT and ran nothing, so it is loaded and
// the write sent again, once.
func (c *Cache[V]) writeConfirmed(ctx context.Context, keys []string, script *redis.Script, pipe func(redis.Pipeliner), direct func() error) (err error) {
	began := time.Now()
	defer func() { c.cfg.emit(EventWrite, keys[0], time.Since(began), err) }()
	loaded := script == nil
	for attempt := 1; ; attempt++ {
		var wait func() error
		if t := c.writeTracker(); t != nil {
			wait, err = t.Write(ctx, keys, pipe, direct)
		} else {
			err = direct()
		}
		if !loaded && isNoScript(err) {
			loaded = true
			if lerr := script.Load(ctx, c.rdb).Err(); lerr == nil {
				attempt--
				continue
			}
		}
		if c.redisCall(keys[0], err) == errNone {
			c.nearDrop(keys...)
			c.quarantine.forget(keys...) // a value loaded before the write must not be served after it
			if wait == nil {
				return nil
			}
			if err := wait(); err != nil { // the write is done: say so
				return fmt.Errorf("cache: %q written, but near caches not confirmed: %w", keys[0], err)
			}
			return nil
		}
		if c.classify(err) != errTransient || !c.cfg.retry.wait(ctx, attempt) {
			return fmt.Errorf("cache: redis: %w", err)
		}
	}
}

// expire is Expire.
func (c *Cache[V]) expire(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	full, err := c.key(key)
	if err != nil {
		return err
	}
	if c.cfg.stale <= 0 {
		return c.delete(ctx, []string{key})
	}
	defer c.group.Forget(full) // later callers must not join a flight that began before
	for range expireTries {
		if !c.brk.Allow() {
			return c.brk.Err()
		}
		done, err := c.expireOnce(ctx, key, full)
		if done || err != nil {
			return err
		}
		// A record written since the read: a load's commit may be what
		// changed it, of a source read before Expire was called, so it is
		// expired in turn (a Set concurrent with Expire may be ordered
		// before it).
	}
	return c.delete(ctx, []string{key})
}

// expireTries is how many times Expire reads and rewrites a record that
// keeps changing before it deletes it instead.
const expireTries = 3

// expireOnce reads key's record (full: with the prefix) and replaces it by
// its expired copy, or deletes key when there is nothing to fall back on;
// done is false when the record changed between the read and the rewrite.
func (c *Cache[V]) expireOnce(ctx context.Context, key, full string) (done bool, err error) {
	b, err := c.redisio.Get(ctx, full) // from the master, as every read of the miss path
	switch c.readReply(full, err) {
	case readHit:
	case readMiss: // nothing to keep as the fallback: voided as Delete voids a load in flight
		return true, c.delete(ctx, []string{key})
	default:
		return true, fmt.Errorf("cache: redis: %w", err)
	}
	flags, payload, err := record.Decode(b)
	if err != nil || flags&record.FlagNotFound != 0 {
		return true, c.delete(ctx, []string{key}) // nothing to fall back on
	}
	f, fresh := record.ReadFreshness(b)
	if !fresh {
		return true, c.delete(ctx, []string{key})
	}
	var st *record.Stamp // the value keeps its stamp: Expire does not make it current
	if s, ok := record.ReadStamp(b); ok {
		st = &s
	}
	expired := record.Build(record.FlagExpired, record.Freshness{Expiry: time.Now(), Load: f.Load, TTL: f.TTL}, st, payload)
	if v, ok := record.ReadVersion(b); ok { // a versioned Set older than the value is still refused
		expired = record.AddVersion(expired, v)
	}
	keys, args := []string{full, LockKey(full)}, []any{b, expired, c.notify.Channel(full)}
	var cmd *redis.Cmd
	err = c.writeConfirmed(ctx, []string{full}, expireScript,
		func(p redis.Pipeliner) { cmd = expireScript.EvalSha(ctx, p, keys, args...) },
		func() error { cmd = expireScript.Run(ctx, c.rdb, keys, args...); return cmd.Err() })
	if err != nil {
		return true, err
	}
	if cmd == nil {
		return true, nil
	}
	n, _ := cmd.Int()
	return n == 1, nil
}
