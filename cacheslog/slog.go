// Package cacheslog logs what a [cache.Cache] handles on its own, through
// log/slog: the errors of [cache.WithErrorHook] and the events of
// [cache.WithObserver] worth a line (Redis errors, the circuit breaker, lost
// locks, failed refreshes), a line each. The cache itself logs only a
// few lines, each once, through [cache.WithLogger] ([slog.Default] unless
// set): the first failure of a Redis outage and its end, the beginning of a
// memory-pressure episode, and warnings about its setup (a server without
// client-side caching, an ACL that refuses what the near cache needs).
//
//	products := cache.New[Product](rdb,
//		cache.WithErrorHook(cacheslog.ErrorHook(logger)),
//		cache.WithObserver(cacheslog.Observer(logger)),
//	)
//
// It needs only the standard library, so it lives in the root module. For
// counts and durations use metrics (the OpenTelemetry adapter,
// github.com/stampede-go/stampede/otel); to send events to both, give
// [cache.WithObserver] once for each.
//
// Wired together, ErrorHook and Observer log a Redis error that [cache.FailOpen]
// turned into an uncached load twice (Observer: the Redis error as it
// happened; ErrorHook: what the cache did about it), and a lost lock twice.
// A Redis outage logs one line per failed call until the circuit breaker
// opens, then nothing until it closes.
package cacheslog

import (
	"context"
	"errors"
	"log/slog"

	"github.com/stampede-go/stampede/cache"
)

// ErrorHook returns a function for [cache.WithErrorHook] that logs each error
// the cache handled without returning it to a caller, with the key and the
// error as attributes "key" and "error", at Warn (a Delete or Set winning over
// a load is not an error: the cache reports it as [cache.EventLoadVoided]
// only). A nil
// logger means [slog.Default] at the time of each error. The function is safe
// for concurrent use if the logger's handler is, as slog's handlers are.
func ErrorHook(logger *slog.Logger) func(key string, err error) {
	return func(key string, err error) {
		orDefault(logger).LogAttrs(context.Background(), slog.LevelWarn, "cache: error handled",
			slog.String("key", key), slog.Any("error", err))
	}
}

// Observer returns a function for [cache.WithObserver] that logs these
// events, each with the attributes "key" (the full Redis key) and, where
// the event has one, "error":
//
//	Warn  cache: redis error               a Redis call failed
//	Warn  cache: circuit breaker open      Redis is skipped until a probe succeeds
//	Info  cache: circuit breaker closed    the probe succeeded
//	Warn  cache: lock ran out, value not stored   the holder was held up past the lock TTL
//	Warn  cache: stale value served        because its refresh failed
//	Warn  cache: refresh failed            a background refresh's error (not ErrNotFound)
//
// Other events (hits, misses, loads, waits) are metrics, not log lines; they
// cost a switch and nothing else. A nil logger means [slog.Default] at the
// time of each event. The function is safe for concurrent use if the
// logger's handler is.
func Observer(logger *slog.Logger) func(cache.Event) {
	return func(e cache.Event) {
		var (
			level = slog.LevelWarn
			msg   string
		)
		switch e.Kind {
		case cache.EventRedisError:
			msg = "cache: redis error"
		case cache.EventBreakerOpen:
			msg = "cache: circuit breaker open"
		case cache.EventBreakerClose:
			level, msg = slog.LevelInfo, "cache: circuit breaker closed"
		case cache.EventLockLost:
			msg = "cache: lock ran out, value not stored"
		case cache.EventStaleServed:
			if e.Err == nil {
				return // served while a refresh runs: the normal case
			}
			msg = "cache: stale value served"
		case cache.EventRefresh:
			if e.Err == nil || errors.Is(e.Err, cache.ErrNotFound) {
				return
			}
			msg = "cache: refresh failed"
		default:
			return
		}
		l := orDefault(logger)
		if e.Err == nil || e.Kind == cache.EventLockLost { // its error only restates the event
			l.LogAttrs(context.Background(), level, msg, slog.String("key", e.Key))
			return
		}
		l.LogAttrs(context.Background(), level, msg, slog.String("key", e.Key), slog.Any("error", e.Err))
	}
}

func orDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
