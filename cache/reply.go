package cache

// What a Redis reply means for one caller, and what happens next: every
// path that reads a value (GetOrLoad's flight, GetOrLoadMany's rounds, Get,
// the refreshes) asks the functions here, so that a caller's options mean
// the same whichever path, and whichever caller's flight, answered it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/freshness"
	"github.com/stampede-go/stampede/internal/record"
)

// readVerdict is what a read's error means.
type readVerdict uint8

const (
	readHit    readVerdict = iota // bytes to decode
	readMiss                      // nothing there, or nothing to wait out but a transient error
	readFatal                     // misconfiguration: returned under every policy
	readOutage                    // Redis could not serve: the failure policy decides
)

// readReply records a read's outcome (see redisCall) and says what it
// means.
func (c *Cache[V]) readReply(key string, err error) readVerdict {
	return verdictOf(c.redisCall(key, err), err)
}

// verdictOf is readReply for an error already classified.
func verdictOf(class errClass, err error) readVerdict {
	switch {
	case err == nil:
		return readHit
	case errors.Is(err, redis.Nil), isWrongType(err), class == errTransient:
		return readMiss
	case class == errFatal:
		return readFatal
	}
	return readOutage
}

// lockStep is what one read-or-lock call's reply calls for.
type lockStep uint8

const (
	lockFound     lockStep = iota // a value: judge it
	lockTaken                     // the load lock is ours: load
	lockHeld                      // another holder has it: wait for its commit
	lockTransient                 // a slot migrating, a failover: wait it out like a held lock
	lockFatal                     // misconfiguration, or a reply the script cannot give: the caller's error
	lockLost                      // an outage (or OOM): the lock is ours if only the reply was lost; the failure policy decides
)

// lockStepOf says what a read-or-lock reply (class: its error's, as
// redisCall or round classified it) calls for, with the record found.
func lockStepOf(class errClass, cmd *redis.Cmd) (lockStep, []byte) {
	switch class {
	case errNone:
	case errTransient:
		return lockTransient, nil
	case errFatal:
		return lockFatal, nil
	default:
		return lockLost, nil
	}
	res, err := cmd.Slice()
	if err != nil || len(res) != 2 {
		return lockFatal, nil
	}
	switch {
	case res[0] == int64(1):
		s, ok := res[1].(string)
		if !ok {
			return lockFatal, nil
		}
		return lockFound, []byte(s)
	case res[1] == int64(1):
		return lockTaken, nil
	}
	return lockHeld, nil
}

// lockError is the caller's error for a read-or-lock of key that ended in
// lockFatal.
func lockError(key string, cmd *redis.Cmd) error {
	if err := cmd.Err(); err != nil {
		return fmt.Errorf("cache: redis: %w", err)
	}
	return fmt.Errorf("cache: redis: read-or-lock of %q: unexpected reply %v", key, cmd.Val())
}

// verdict is what one record read means for one caller.
type verdict[V any] struct {
	hit *result[V] // the answer (a value, a not-found, a codec error); nil: a miss
	due bool       // hit calls for a refresh (early, or stale)
	// prior is, on a miss, the value read that the reload replaces (nil:
	// none): the reload keeps its tags and TTL.
	prior *result[V]
	// fallback: prior was expired by hand under WithStale, and is served,
	// stale, if the reload fails.
	fallback bool
}

// judge decides what a caller does with record r it read (nil:
// unreadable): for a caller that loads (loads: GetOrLoad, GetOrLoadMany),
// a fresh value is a hit, one due for early refresh a hit with its refresh
// due, a stale one is served (unless [NoStale]) with its refresh due, or
// without one while a failed refresh's throttle lasts; a value expired by
// hand ([Cache.Expire]) or lacking one of the call's [Tags] is a miss,
// reloaded with the old value's tags. For [Cache.Get] (loads false),
// nothing is due and a value expired by hand is stale (it is past its TTL)
// like any other. It reports the hits and stale values it serves
// (EventHit, EventStaleServed), but for stale values whose refresh is due,
// which refreshDue reports once it knows how they were served.
func (c *Cache[V]) judge(key string, r *result[V], o callOptions, loads bool) verdict[V] {
	switch {
	case r == nil || r.err != nil:
		return verdict[V]{hit: r}
	case r.quarantined: // served instead of a load: Get, which never loads, misses
		if !loads {
			return verdict[V]{}
		}
		c.cfg.emit(EventQuarantined, key, 0, nil)
		return verdict[V]{hit: r}
	case loads && r.expired: // whatever the clocks say
		return verdict[V]{prior: r, fallback: c.cfg.stale > 0 && !o.noStale}
	case loads && !stampHolds(r.stamp, o.store.tags):
		return verdict[V]{prior: r}
	}
	head := r.head // the early-refresh draw: only for a caller that refreshes
	if !loads {
		head = nil
	}
	due := false
	switch c.cfg.freshnessPolicy().Of(r.freshness, r.throttled, r.at, head) { // r.at is a moment ago: no clock read on a hit
	case freshness.Fresh:
	case freshness.Refresh:
		due = loads
	case freshness.Stale:
		return c.judgeStale(key, r, o, loads)
	default:
		return verdict[V]{prior: r}
	}
	c.cfg.emit(EventHit, key, 0, nil)
	return verdict[V]{hit: r, due: due}
}

// judgeStale is judge of a value past its TTL that WithStale may serve.
func (c *Cache[V]) judgeStale(key string, r *result[V], o callOptions, loads bool) verdict[V] {
	if o.noStale {
		return verdict[V]{prior: r} // reloaded under the lock
	}
	r.stale = true
	switch {
	case !loads:
		c.cfg.emit(EventStaleServed, key, 0, nil)
		return verdict[V]{hit: r}
	case r.throttled && r.at.Before(r.freshness.Expiry): // its refresh failed: retried once the throttle ends
		c.cfg.emit(EventStaleServed, key, 0, ErrRefreshFailed)
		return verdict[V]{hit: r}
	}
	return verdict[V]{hit: r, due: true} // EventStaleServed once it is known how (see refreshDue)
}

// accepts reports whether a caller with options o may take r, the answer
// of a flight that another caller of the key, with other options, may have
// started: not a stale value if o refuses them, not a stored value without
// o's tags (a [Cache.DeleteByTag] of them would leave it).
func accepts[V any](r *result[V], o callOptions) bool {
	if r.stale && o.noStale {
		return false
	}
	return r.stamp == nil || stampHolds(r.stamp, o.store.tags)
}

// stampHolds reports whether a record stamped st carries every tag of tags.
func stampHolds(st *record.Stamp, tags []string) bool {
	if st == nil {
		return len(tags) == 0
	}
	return holdsTags(st.Tags, tags)
}

// holdsTags reports whether has holds every tag of tags.
func holdsTags(has, tags []string) bool {
	for _, t := range tags {
		if !slices.Contains(has, t) {
			return false
		}
	}
	return true
}

// loadKey is the loadKey of a key whose lock lk was taken by a call sent
// at at, reloading what v found there (see verdict).
func (v verdict[V]) loadKey(key, name string, lk *loadLock, at time.Time) loadKey {
	k := loadKey{key: key, name: name, lk: lk, locked: at}
	if p := v.prior; p != nil {
		k.prior, k.kept = p.stamp, p.freshness.TTL
		if v.fallback {
			k.fallback = p.data
		}
	}
	return k
}

// releaseLost releases, in the background, locks whose taking met an
// outage: they are ours if only the reply was lost. On a stalled Redis a
// second round trip would double the wait before the failure policy
// applies; the goroutine ends with the release, bounded by the lock TTL.
func (c *Cache[V]) releaseLost(ctx context.Context, lks ...*loadLock) {
	if len(lks) > 0 {
		go c.endLocks(ctx, releases(lks))
	}
}
