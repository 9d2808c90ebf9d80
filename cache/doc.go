// Package cache is a Redis read-through cache that loads a missing key once,
// however many goroutines and processes ask for it at the same moment.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	products := cache.New[Product](rdb, cache.WithPrefix("product:"), cache.WithTTL(10*time.Minute))
//	defer products.Close()
//
//	p, err := products.GetOrLoad(ctx, "42", func(ctx context.Context) (Product, error) {
//		return db.FindProduct(ctx, "42") // one call, however many callers
//	})
//
// (The package Example runs this in CI.) A hot key that expires, or a cold
// start, sends every concurrent request to the database at once: a cache
// stampede. [Cache.GetOrLoad] lets one caller across all the processes
// sharing the Redis load the value; the others wait for it and read it from
// Redis. Hot values are then served from process memory by the near cache,
// which is on by default; other hits cost one Redis GET, shared by the
// callers that ask at the same time.
//
// # The API
//
// [New] makes a [Cache] for one value type on a go-redis client (plain,
// failover, [redis.ClusterClient] or [redis.Ring]); create it once, reuse
// it, and [Cache.Close] it at shutdown. [Cache.GetOrLoad] reads through;
// [Cache.GetOrLoadMany] reads a batch with one loader call; [Cache.Get]
// reads without loading; [Cache.Set] writes a new value through after the
// source changed, and [Cache.Delete] removes one; [Cache.Ping] is a
// readiness check. A loader returns [ErrNotFound] for a value that does not
// exist (cached for [WithNotFoundTTL]), and may set its value's TTL
// ([SetTTL]) or keep it out of the cache ([DoNotCache]).
//
// Options set the TTL ([WithTTL], [WithJitter]) and the keys
// ([WithPrefix]); serve stale values while the database fails ([WithStale],
// [WithResultInfo], [WithSoftLoadTimeout]); refresh hot keys before they
// expire ([WithEarlyRefresh], on by default); size or turn off the near
// cache ([WithNearCache], on by default with 32 MiB; [WithoutNearCache]);
// bound the waits ([WithLoadTimeout], [WithRetry],
// [WithLockTTL]); report ([WithObserver], [WithErrorHook], [WithLogger]);
// and encode values ([WithCodec], JSON by default).
//
// # Guarantees
//
// While the loading process is alive, a key is loaded once per TTL across
// all goroutines of all processes; a crashed loader holds the others up for
// at most the lock TTL (5s), and a frozen one can never overwrite a newer
// value. A call that begins after [Cache.Delete] or [Cache.Set] returned,
// in any process, never gets the old value, from Redis or from a near
// cache (not across a Redis failover, nor with [WithReplicaReads]). A
// loader's error or panic is returned, not cached. A Cache is safe for
// concurrent use.
//
// # Near cache
//
// The near cache, on by default ([WithNearCache] sets its budget,
// [WithoutNearCache] turns it off), serves hot values from process memory
// with no Redis round trip. Redis reports every write of a key under the
// prefix, by anyone, and the value is dropped in every process. A process
// serves memory only while it holds a lease ([WithNearLease], 1s), and
// [Cache.Delete] and [Cache.Set] return once every process that may hold
// the key has dropped it or its lease has run out, which costs a write a
// hop to each other process and back. While a process cannot be sure it
// receives those reports it reads through Redis. Writes by other programs
// are not waited for.
//
// # Read coalescing
//
// Callers of one key in a process share one flight; the GETs of concurrent
// flights go out together, without a timer, as one MGET (per slot and
// master on a cluster) when the read on the wire returns.
//
// # Failure policy
//
// When Redis cannot be reached, [FailOpen] (the default) calls the loader
// without the cross-process lock, once per key per process at a time, and
// returns the value uncached; [FailClosed] returns the error. A circuit
// breaker then skips Redis for a second at a time ([WithCircuitBreaker]).
// The first failure of an outage is logged once through [slog.Default]
// ([WithLogger]); errors the cache absorbs go to [WithErrorHook]. Replies
// that mean misconfiguration (NOAUTH, NOPERM, an unknown command) are
// returned under every policy.
//
// Step by step, with the scripts, keys and record format:
// https://github.com/stampede-go/stampede/blob/main/docs/PROTOCOL.md; every
// guarantee with what it assumes and costs:
// https://github.com/stampede-go/stampede/blob/main/docs/GUARANTEES.md. For
// a lock on its own, see package github.com/stampede-go/stampede/lock.
package cache
