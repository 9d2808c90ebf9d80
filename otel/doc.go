// Package cacheotel turns the events of a [cache.Cache], and of the
// standalone lock, into OpenTelemetry metrics. It is its own module,
// github.com/stampede-go/stampede/otel, so that the cache and lock
// packages do not depend on OpenTelemetry:
//
//	obs, err := cacheotel.Observer("products") // the global MeterProvider
//	if err != nil { ... }
//	products := cache.New[Product](rdb, cache.WithObserver(obs))
//
// # Metrics
//
// Every data point carries cache.name, the name given to [Observer], and the
// attributes of [WithAttributes]. The key is never an attribute: its
// cardinality has no bound. Each metric counts one kind of thing, so that
// summing a metric over its attributes means something (the OpenTelemetry
// semantic conventions' rule); loads, waits and refreshes are counted by
// their duration histograms, as http.server.request.duration counts requests.
// cache.load.duration has every call of the loader, background refreshes
// included; cache.refresh.duration has the refreshes alone. With a near
// cache (cache.WithNearCache) a read served from process memory is counted
// by cache.near.hits, once per caller, and not by cache.lookups, which counts
// reads of Redis: with a near cache, lookups are its misses. Removals count
// single keys; a drop empties the whole near cache (a lost invalidation
// connection, a reconnect, a change of masters, a flush) and is counted once.
//
//	cache.lookups             counter    {lookup}      cache.lookup.result = hit | miss
//	cache.lock.contentions    counter    {contention}  another holder was loading the key
//	cache.wait.woken          counter    {wait}        a wait ended by the holder's notification
//	cache.lock.lost           counter    {load}        a loaded value not stored: its lock ran out
//	cache.load.voided         counter    {load}        a loaded value not stored: a Delete or Set won
//	cache.stale.served        counter    {value}       cache.stale.reason = refreshing | error
//	cache.redis.errors        counter    {error}       failed Redis calls
//	cache.breaker.transitions counter    {transition}  cache.breaker.state = open | closed
//	cache.breaker.open        updown     {breaker}     1 while the breaker is open, 0 once closed
//	cache.decode.errors       counter    {record}      a record the codec could not decode (another type or program)
//	cache.decode.quarantined  counter    {flight}      a read of such a record answered with the value last loaded, no load
//	cache.encode.errors       counter    {value}       a loaded value the codec could not encode: returned, not stored
//	cache.loads.uncached      counter    {key}         a key loaded under FailOpen while Redis could not serve it
//	cache.near.hits           counter    {hit}         a value served from the near cache, no Redis call
//	cache.near.removals       counter    {entry}       cache.near.reason = invalidation | eviction
//	cache.near.drops          counter    {drop}        the near cache emptied: invalidations may have been missed
//	cache.near.lease_waits    counter    {wait}        a Delete or Set waited out another process's near-cache lease
//	cache.load.duration       histogram  s             cache.outcome = ok | not_found | error
//	cache.wait.duration       histogram  s             cache.outcome = ok | error
//	cache.refresh.duration    histogram  s             cache.outcome = ok | not_found | error
//	cache.write.duration      histogram  s             cache.outcome = ok | error (a write with its near caches' confirmation)
//
// The histograms' default buckets ([Buckets]) span 1 ms to 30 s; a View in
// the MeterProvider can change them.
//
// # Lock metrics
//
// [LockObserver] does the same for the standalone lock (package lock, given
// with lock.WithObserver to each Obtain, ObtainQuorum or Do): every data
// point carries lock.name, the name given to it, never the key. The calls
// that took a lock or gave up are counted by lock.wait.duration, as loads
// are by cache.load.duration; losses are counted once per acquisition.
//
//	lock.wait.duration        histogram  s             lock.outcome = obtained | not_obtained | error: how long a call took
//	lock.attempts             counter    {attempt}     lock.outcome: the attempts those calls made, retries included
//	lock.losses               counter    {loss}        lock.lost.found = held (a renewal, TTL, Hold's lease run out) | release
//	lock.fence.refusals       counter    {write}       a store refused a write under a lock's fence (Lock.FenceRefused)
//
// # Cost
//
// The observer runs on the goroutine of every cache call, hits included. The
// attribute sets are built once, in [Observer]; an event costs one Add or
// Record on an instrument and no allocation of this package's own.
package cacheotel
