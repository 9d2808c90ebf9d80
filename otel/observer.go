// This file builds the instruments and the attribute sets once, and maps
// each cache event to one measurement.

package cacheotel

import (
	"context"
	"errors"

	"github.com/stampede-go/stampede/cache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter the observers use.
const ScopeName = "github.com/stampede-go/stampede/otel"

// Buckets are the histograms' explicit bucket boundaries, in seconds: 1 ms
// to 30 s, about three per decade. A load or wait longer than 30 s falls in
// the overflow bucket.
var Buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// The attribute keys.
const (
	KeyName         = attribute.Key("cache.name")          // the name given to Observer
	KeyLookupResult = attribute.Key("cache.lookup.result") // hit | miss
	KeyOutcome      = attribute.Key("cache.outcome")       // ok | not_found | error
	KeyStaleReason  = attribute.Key("cache.stale.reason")  // refreshing | error
	KeyBreakerState = attribute.Key("cache.breaker.state") // open | closed
	KeyNearReason   = attribute.Key("cache.near.reason")   // invalidation | eviction
)

// The values of KeyOutcome, as indexes of observer.outcome.
const (
	outcomeOK = iota
	outcomeNotFound
	outcomeError
	numberOfOutcomes
)

var outcomeNames = [numberOfOutcomes]string{outcomeOK: "ok", outcomeNotFound: "not_found", outcomeError: "error"}

// Observer returns a function for [cache.WithObserver] that records the
// cache's events as the metrics listed in the package documentation, each
// data point with cache.name = name. Several caches may share a name (the
// instances of one cache in one process) and an observer.
//
// The MeterProvider is [go.opentelemetry.io/otel.GetMeterProvider] unless [WithMeterProvider]
// says otherwise. It returns an error if name is empty or an instrument
// cannot be created; the observer it returns with such an error still
// works, recording what it can. The returned function is safe for
// concurrent use.
func Observer(name string, opts ...Option) (func(cache.Event), error) {
	in, base := start(opts, KeyName, "cache", name)
	counter, histogram := in.counter, in.histogram
	open, err := in.m.Int64UpDownCounter("cache.breaker.open", metric.WithUnit("{breaker}"),
		metric.WithDescription("Circuit breakers open now: 1 while the breaker of the cache keeps calls off Redis, 0 once it closed (summed over the caches sharing the name)."))
	in.errs = append(in.errs, err)
	o := &observer{
		breakerOpenNow: open,
		lookups:        counter("cache.lookups", "{lookup}", "Reads of a key in Redis, by result: a hit, or a miss that a load or a wait follows."),
		contentions:    counter("cache.lock.contentions", "{contention}", "Misses that found another holder loading the key, and waited for it."),
		woken:          counter("cache.wait.woken", "{wait}", "Waits ended by the holder's notification rather than by polling."),
		lockLost:       counter("cache.lock.lost", "{load}", "Loaded values not stored because the lock ran out while the holder was held up."),
		loadVoided:     counter("cache.load.voided", "{load}", "Loaded values not stored because a Delete or Set of the key won over the load."),
		staleServed:    counter("cache.stale.served", "{value}", "Values past their TTL served, by reason: a refresh runs, or it failed."),
		redisErrors:    counter("cache.redis.errors", "{error}", "Redis calls that failed."),
		breaker:        counter("cache.breaker.transitions", "{transition}", "Circuit breaker transitions, by the state entered."),
		nearHits:       counter("cache.near.hits", "{hit}", "Values served from the near cache in process memory, with no Redis call (not counted in cache.lookups)."),
		nearRemoved:    counter("cache.near.removals", "{entry}", "Keys removed from the near cache, by reason: a write invalidated them, or the byte budget evicted them."),
		nearDrops:      counter("cache.near.drops", "{drop}", "Times the whole near cache was emptied: invalidations could have been missed, or Redis was flushed."),
		nearLeaseWaits: counter("cache.near.lease_waits", "{wait}",
			"Deletes and Sets that waited out another process's near-cache lease (frozen, cut off) instead of its acknowledgement."),
		decodeErrors: counter("cache.decode.errors", "{record}",
			"Records read from Redis that the codec could not decode (another value type or program writes the keys), each treated as a miss."),
		encodeErrors: counter("cache.encode.errors", "{value}",
			"Loaded values the codec could not encode: returned to their callers, not stored."),
		quarantined: counter("cache.decode.quarantined", "{flight}",
			"Reads of a key whose record could not be decoded answered with the value last loaded for it instead of a load (the key is quarantined)."),
		uncachedLoads: counter("cache.loads.uncached", "{key}",
			"Keys loaded without Redis under FailOpen while Redis could not serve them: the database takes the cache's load."),
		loadTime:    histogram("cache.load.duration", "Duration of the loader's calls, by outcome."),
		waitTime:    histogram("cache.wait.duration", "Duration of waits for another holder's load, by outcome."),
		refreshTime: histogram("cache.refresh.duration", "Duration of background refreshes, by outcome."),
		writeTime:   histogram("cache.write.duration", "Duration of writes (Set, Delete, Expire, DeleteByTag, Clear) with their confirmation by every process's near cache, by outcome."),
	}

	// The last of equal keys wins in a set: the package's own come last.
	set := func(extra ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), extra...)...)
	}
	add := func(extra ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(set(extra...))}
	}
	o.plain = add()
	o.hit = add(KeyLookupResult.String("hit"))
	o.miss = add(KeyLookupResult.String("miss"))
	o.staleRefreshing = add(KeyStaleReason.String("refreshing"))
	o.staleError = add(KeyStaleReason.String("error"))
	o.breakerOpen = add(KeyBreakerState.String("open"))
	o.breakerClosed = add(KeyBreakerState.String("closed"))
	o.nearInvalidated = add(KeyNearReason.String("invalidation"))
	o.nearEvicted = add(KeyNearReason.String("eviction"))
	for i, n := range outcomeNames {
		o.outcome[i] = []metric.RecordOption{metric.WithAttributeSet(set(KeyOutcome.String(n)))}
	}
	return o.observe, in.err()
}

// observer holds the instruments and, for each measurement, its options
// with the attribute set built once. It is read-only after Observer, so safe
// for concurrent use.
type observer struct {
	lookups, contentions, woken, lockLost, loadVoided, staleServed, redisErrors, breaker metric.Int64Counter
	nearHits, nearRemoved, nearDrops, nearLeaseWaits, decodeErrors                       metric.Int64Counter
	encodeErrors, uncachedLoads, quarantined                                             metric.Int64Counter
	breakerOpenNow                                                                       metric.Int64UpDownCounter
	loadTime, waitTime, refreshTime, writeTime                                           metric.Float64Histogram

	plain, hit, miss, staleRefreshing, staleError, breakerOpen, breakerClosed []metric.AddOption
	nearInvalidated, nearEvicted                                              []metric.AddOption
	outcome                                                                   [numberOfOutcomes][]metric.RecordOption
}

// observe records one event; kinds it does not know are ignored.
func (o *observer) observe(e cache.Event) {
	// Events carry no context; Background means no exemplar links to a span.
	ctx := context.Background()
	switch e.Kind {
	case cache.EventHit:
		o.lookups.Add(ctx, 1, o.hit...)
	case cache.EventMiss:
		o.lookups.Add(ctx, 1, o.miss...)
	case cache.EventLoad:
		o.loadTime.Record(ctx, e.Duration.Seconds(), o.outcome[outcomeOf(e.Err)]...)
	case cache.EventLockContended:
		o.contentions.Add(ctx, 1, o.plain...)
	case cache.EventWait:
		o.waitTime.Record(ctx, e.Duration.Seconds(), o.outcome[outcomeOf(e.Err)]...)
	case cache.EventWoken:
		o.woken.Add(ctx, 1, o.plain...)
	case cache.EventLockLost:
		o.lockLost.Add(ctx, 1, o.plain...)
	case cache.EventLoadVoided:
		o.loadVoided.Add(ctx, 1, o.plain...)
	case cache.EventStaleServed:
		if e.Err == nil {
			o.staleServed.Add(ctx, 1, o.staleRefreshing...)
		} else {
			o.staleServed.Add(ctx, 1, o.staleError...)
		}
	case cache.EventRefresh:
		o.refreshTime.Record(ctx, e.Duration.Seconds(), o.outcome[outcomeOf(e.Err)]...)
	case cache.EventRedisError:
		o.redisErrors.Add(ctx, 1, o.plain...)
	case cache.EventBreakerOpen:
		o.breaker.Add(ctx, 1, o.breakerOpen...)
		o.breakerOpenNow.Add(ctx, 1, o.plain...)
	case cache.EventBreakerClose:
		o.breaker.Add(ctx, 1, o.breakerClosed...)
		o.breakerOpenNow.Add(ctx, -1, o.plain...)
	case cache.EventDecodeError:
		o.decodeErrors.Add(ctx, 1, o.plain...)
	case cache.EventEncodeError:
		o.encodeErrors.Add(ctx, 1, o.plain...)
	case cache.EventUncachedLoad:
		o.uncachedLoads.Add(ctx, 1, o.plain...)
	case cache.EventQuarantined:
		o.quarantined.Add(ctx, 1, o.plain...)
	case cache.EventWrite:
		o.writeTime.Record(ctx, e.Duration.Seconds(), o.outcome[outcomeOf(e.Err)]...)
	case cache.EventNearHit:
		o.nearHits.Add(ctx, 1, o.plain...)
	case cache.EventNearInvalidation:
		o.nearRemoved.Add(ctx, 1, o.nearInvalidated...)
	case cache.EventNearEviction:
		o.nearRemoved.Add(ctx, 1, o.nearEvicted...)
	case cache.EventNearDrop:
		o.nearDrops.Add(ctx, 1, o.plain...)
	case cache.EventNearLeaseWait:
		o.nearLeaseWaits.Add(ctx, 1, o.plain...)
	}
}

func outcomeOf(err error) int {
	switch {
	case err == nil:
		return outcomeOK
	case errors.Is(err, cache.ErrNotFound):
		return outcomeNotFound
	default:
		return outcomeError
	}
}
