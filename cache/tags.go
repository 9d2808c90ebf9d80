// This file is tag invalidation and Clear (see WithTags). Every record of a
// Cache with tags carries a stamp: the prefix's tag clock, read before the
// value was loaded or written, and the value's tags. DeleteByTag and Clear
// advance the clock and set a version key (the tag's, or the Cache's) to
// it: a record whose tag, or whose Cache, has a version past its clock is
// no longer current, whichever slot it lives in. The versions (see
// internal/tags) live in one slot of the prefix; a process with a near
// cache keeps them in memory under the same coherence as values, so hits
// read them from memory.

package cache

import (
	"context"
	_ "embed"
	"errors"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/rediserr"
)

var (
	//go:embed scripts/tags.lua
	tagsLua    string
	tagsScript = redis.NewScript(tagsLua)
)

// tagMemory is how long a version key outlives its last DeleteByTag or
// Clear, and so the longest a stamped record may live in Redis: a record
// stamped before the version must be gone when the version is. The clock
// is kept as long past the last of them (see scripts/tags.lua).
const tagMemory = 30 * 24 * time.Hour

// ErrNoTags is returned by [Cache.DeleteByTag], [Cache.Clear] and by calls
// given [Tags] on a Cache made without [WithTags].
var ErrNoTags = errors.New("cache: tags and Clear need WithTags")

// checkTags validates tags given to a call.
func (c *Cache[V]) checkTags(tags []string) error {
	if len(tags) == 0 {
		return nil
	}
	if !c.cfg.tags {
		return ErrNoTags
	}
	if slices.Contains(tags, "") {
		return errors.New("cache: empty tag")
	}
	return nil
}

// deleteVersions advances the clock and sets the version keys of keys to
// it, confirmed with every near cache as any write is: DeleteByTag and
// Clear.
func (c *Cache[V]) deleteVersions(ctx context.Context, keys []string) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	if !c.cfg.tags {
		return ErrNoTags
	}
	if !c.brk.Allow() {
		return c.brk.Err()
	}
	all := append([]string{c.tags.Clock}, keys...)
	mem := tagMemory.Milliseconds()
	// The clock is dropped from memory with the versions: this process's
	// next loads must not be stamped before them (never current, they
	// would load again until the clock's invalidation arrives).
	dropped := append(slices.Clone(keys), c.tags.Clock)
	defer c.quarantine.clear() // any value kept may carry the tags, or predate the Clear
	return c.writeConfirmed(ctx, dropped, tagsScript,
		func(p redis.Pipeliner) { tagsScript.EvalSha(ctx, p, all, mem) },
		func() error { return tagsScript.Run(ctx, c.rdb, all, mem).Err() })
}

// deleteByTag is DeleteByTag.
func (c *Cache[V]) deleteByTag(ctx context.Context, tags []string) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	if !c.cfg.tags {
		return ErrNoTags
	}
	if len(tags) == 0 {
		return nil
	}
	if err := c.checkTags(tags); err != nil {
		return err
	}
	return c.deleteVersions(ctx, c.tags.Keys(tags))
}

// guardTags puts the reads of tag versions behind the breaker (see
// tags.Versions.Guard), as any Redis call of the Cache: kept off Redis
// while it is open but for its probe, their outcomes recorded (a read
// that follows a successful probe finds it closed). Neither function holds
// the Cache: the near caches' shared connections reach the versions, and a
// Cache dropped without Close must stay collectable (see New).
func (c *Cache[V]) guardTags() {
	brk, cluster := c.brk, c.cluster
	ev := &config{counts: c.cfg.counts, observer: c.cfg.observer, onError: c.cfg.onError}
	c.tags.Guard(func() error {
		if !brk.Allow() {
			return brk.Err()
		}
		return nil
	}, func(key string, err error) {
		class := rediserr.Classify(err, cluster)
		brk.Record(key, class, err)
		if class != errNone {
			ev.emit(EventRedisError, key, 0, err)
		}
	})
}

// stampRead returns the stamp of a record that record.Decode accepted,
// and whether the record is current. A Cache without WithTags checks only
// stamped records; one with it counts an unstamped record as stamped at
// clock 0 (written by a process without tags: current until a Clear). A
// version that cannot be read makes the record a miss (the read's Redis
// error was recorded by the read itself; see tags.Versions.Guard).
func (c *Cache[V]) stampRead(_ string, b []byte, current func(record.Stamp) (bool, error)) (*record.Stamp, bool) {
	st, ok := record.ReadStamp(b)
	if !ok && !c.cfg.tags {
		return nil, true
	}
	cur, err := current(st)
	if err != nil {
		return nil, false
	}
	return &st, cur
}

// read is a flight's read of key and the check of its record's stamp. A
// Cache with tags whose versions are not in memory reads, on a single
// server, those its record needed last time in the same MGET (see
// tags.Versions.Guess): one round trip, coalesced with other reads.
//
// tracked says whether Redis reports the key's next write to this process
// (see redisio.Client.TrackReads), which a per-key near cache needs to keep
// the value.
//
// A read on a caller's own ctx (Get's) is detached on a per-key near
// cache: a deadline that cut it short would close a tracked connection,
// which drops the near cache (see redisio.Client.ReadDetached).
func (c *Cache[V]) read(ctx context.Context, key string, callers bool) (b []byte, current func(record.Stamp) (bool, error), tracked bool, err error) {
	read := c.redisio.Read
	if callers && c.near != nil && c.near.perKey {
		read = c.redisio.ReadDetached
	}
	if c.tags.OneTrip() {
		tags, keys := c.tags.Guess(key)
		rep := read(ctx, key, keys)
		return rep.Val, c.tags.With(ctx, key, tags, keys, rep.Extra), rep.Tracked, rep.Err
	}
	rep := read(ctx, key, nil)
	return rep.Val, func(st record.Stamp) (bool, error) { return c.tags.Current(ctx, st) }, rep.Tracked, rep.Err
}
