// This file is what the cache reports for metrics and logs: one Event per
// step, sent to the function given to WithObserver. The cache depends on no
// metrics library; adapters (OpenTelemetry, slog) live in their own modules.

package cache

import (
	"runtime/debug"
	"time"
)

// EventKind says what an [Event] reports.
type EventKind uint8

// The events, in the order a miss meets them. Duration and Err are set where
// the kind says so.
const (
	// EventHit: a fresh value (or a cached not-found) was read from Redis.
	EventHit EventKind = iota + 1
	// EventMiss: the key was absent, expired or unreadable; in GetOrLoad a
	// load or a wait follows, Get returns ErrCacheMiss.
	EventMiss
	// EventLoad: this process's loader returned. Duration: how long it ran;
	// Err: its error (nil, ErrNotFound, or a failure).
	EventLoad
	// EventLockContended: another holder was loading the key; this flight
	// waits for it.
	EventLockContended
	// EventWait: a wait for another holder ended. Duration: how long it
	// lasted; Err: nil when a value came, else why the wait ended.
	EventWait
	// EventWoken: a waiter was woken by the holder's notification rather
	// than by its poll interval.
	EventWoken
	// EventLockLost: a loaded value was not stored because its lock ran
	// out: the holder was held up (frozen, cut off from Redis) past the lock
	// TTL. Err: [ErrLoadLockLost]; the error hook hears of it too.
	EventLockLost
	// EventStaleServed: a value past its TTL was served. Err: nil when a
	// refresh was started for it; [ErrRefreshFailed] when its refresh failed
	// (or, within the throttle, had failed); an error wrapping
	// context.DeadlineExceeded when the soft load timeout passed first.
	EventStaleServed
	// EventRefresh: a background refresh (early refresh, or revalidation of
	// a stale value) ended. Duration: its load time; Err: its error.
	EventRefresh
	// EventRedisError: a Redis call failed. Err: the error.
	EventRedisError
	// EventBreakerOpen: consecutive Redis outages opened the circuit breaker;
	// Redis is skipped until a probe succeeds.
	EventBreakerOpen
	// EventBreakerClose: a probe succeeded; Redis is used again.
	EventBreakerClose
	// EventNearHit: a value was served from the near cache (see
	// [WithNearCache]), with no Redis call.
	EventNearHit
	// EventNearInvalidation: a write of the key, here or in any process,
	// dropped it from the near cache; for a [Cache.Clear], which empties
	// it, Key is the Clear's version key.
	EventNearInvalidation
	// EventNearEviction: the near cache's byte budget pushed the key out.
	EventNearEviction
	// EventNearDrop: the near cache was emptied because invalidations could
	// have been missed (a lost connection, a reconnect, a change of masters)
	// or Redis was flushed. Key is "".
	EventNearDrop
	// EventDecodeError: the record at the key holds a value the codec could
	// not decode (written by another version of V, another program, or a
	// Cache of another value type on the same prefix); it was treated as a
	// miss, to be replaced, or within the key's quarantine answered with
	// the value last loaded (EventQuarantined). Err: the codec's error. The
	// error hook hears of it too, once per key (per Cache, up to 1024 keys
	// remembered).
	EventDecodeError
	// EventNearLeaseWait: a Delete or Set waited out the coherence lease of
	// a process whose near cache did not acknowledge the write (frozen, cut
	// off, its connection lost) instead of its acknowledgement. Key: that
	// process's holder id.
	EventNearLeaseWait
	// EventLoadVoided: a loaded value was not stored because a Delete or Set
	// of its key ran while it loaded (the write wins, by design: the load
	// may have read the source before the write). Not an error. Err: nil.
	EventLoadVoided
	// EventEncodeError: the codec could not encode a loaded value. The
	// callers get the value, which is not stored. Err: the codec's error;
	// the error hook hears of it too.
	EventEncodeError
	// EventUncachedLoad: under [FailOpen], a key Redis could not serve was
	// loaded and returned without being stored.
	EventUncachedLoad
	// EventWrite: a write of Redis ended: the Redis side of a Set, Delete,
	// Expire, DeleteByTag or Clear with its confirmation by the near caches
	// of every process. Key: the (first) key written; Duration: how long
	// both took; Err: the write's error.
	EventWrite
	// EventQuarantined: a flight that found at the key a record the codec
	// could not decode (EventDecodeError) was answered, without a load, with
	// the value this process loaded for the key last: the key is
	// quarantined, loaded at most once per interval (100 ms doubling to
	// 5 s, at most the TTL) while another program or value type keeps
	// rewriting it. Neither a hit nor a miss; Get, which never loads,
	// misses instead. See docs/GUARANTEES.md.
	EventQuarantined
)

var eventNames = [...]string{
	EventHit: "hit", EventMiss: "miss", EventLoad: "load", EventLockContended: "lock_contended",
	EventWait: "wait", EventWoken: "woken", EventLockLost: "lock_lost", EventStaleServed: "stale_served",
	EventRefresh: "refresh", EventRedisError: "redis_error", EventBreakerOpen: "breaker_open",
	EventBreakerClose: "breaker_close", EventNearHit: "near_hit", EventNearInvalidation: "near_invalidation",
	EventNearEviction: "near_eviction", EventNearDrop: "near_drop", EventDecodeError: "decode_error",
	EventNearLeaseWait: "near_lease_wait", EventLoadVoided: "load_voided", EventEncodeError: "encode_error",
	EventUncachedLoad: "uncached_load", EventWrite: "write", EventQuarantined: "quarantined",
}

// String returns the kind's snake_case name, for metric and log labels.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one step of the cache's work on a key (the full Redis key, prefix
// included).
type Event struct {
	Kind     EventKind
	Key      string
	Duration time.Duration
	Err      error
}

func (cfg *config) emit(kind EventKind, key string, d time.Duration, err error) {
	if cfg.counts != nil {
		cfg.counts.count(kind, err)
	}
	if cfg.observer != nil {
		cfg.observe(Event{Kind: kind, Key: key, Duration: d, Err: err})
	}
}

// observe calls the observer, reporting a panic to the error hook instead
// of letting it end the goroutine (see WithObserver).
func (cfg *config) observe(e Event) {
	defer func() {
		if p := recover(); p != nil && cfg.onError != nil {
			cfg.onError(e.Key, &PanicError{in: "observer", Value: p, stack: debug.Stack()})
		}
	}()
	cfg.observer(e)
}
