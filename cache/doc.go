// Package cache is a Redis read-through cache that loads a missing key once,
// however many goroutines and processes ask for it at the same moment, and
// keeps hot keys from making their callers wait.
//
// A hot key that expires, or a cold start, sends every concurrent request to
// the database at once: a cache stampede. [Cache.GetOrLoad] lets exactly one
// caller across all processes sharing the Redis load the value; the others
// wait for it and read it from Redis. Early refresh reloads a hot key before
// it expires, and stale serving answers from the last value while the
// database is slow or down, so that callers need not wait at all.
//
// # Protocol
//
// For one key, [Cache.GetOrLoad] does the following.
//
//  1. Merge. Callers of the key in this process join one flight
//     (golang.org/x/sync/singleflight) before Redis is touched, so a hot key
//     costs one GET per flight, not one per caller. Each caller waits on its
//     own context; the flight runs detached from them, bounded by
//     [WithLoadTimeout]. Each caller decodes its own copy of the value. A
//     caller that joined a flight after the flight's read (or lock) was sent
//     asks again, so that a [Cache.Delete] in another process that returned
//     before the caller began is never undone by it.
//  2. Read. GET key. A fresh hit ends the flight; a cached not-found record
//     gives [ErrNotFound]. A hit near its expiry starts a background refresh
//     (see Early refresh); a stale one is served as [WithStale] says.
//  3. Read or lock. One Lua script returns the value if it is there, else
//     takes the lock with SET lock token NX PX lockTTL. Because the re-read
//     and the lock attempt are one round trip, no commit can slip between
//     them.
//  4. Wait. If another process holds the lock, wait until its holder commits
//     or releases (a notification, see below) or the backoff passes
//     (default 100ms), and repeat step 3, at most maxRetries times
//     ([WithRetry]; by default as long as the load timeout), then return an
//     error wrapping [ErrLockNotAcquired].
//  5. Load. Only the lock holder calls the loader. A watchdog extends the
//     lock every lockTTL/3 while it runs, so a slow load does not let a
//     second loader in. A panic in the loader becomes a [*PanicError].
//  6. Commit, fenced. One Lua script writes the value with its TTL (plus
//     jitter), deletes the lock and announces the key, only if the lock
//     still holds this holder's token. A holder that lost its lock (frozen
//     past the lease, or a [Cache.Delete] or [Cache.Set] ran) writes
//     nothing. On a loader error the lock is released at once (and
//     announced) and nothing is cached; [ErrNotFound] is cached for
//     [WithNotFoundTTL].
//
// # Notified waiters
//
// The commit and release scripts publish the key on a channel of its Redis
// Cluster slot (SPUBLISH on Redis 7 and later, PUBLISH before), and each
// Cache keeps one subscription per Redis master, opened on the first wait
// and closed after a while without waiters or by [Cache.Close]. A waiter
// wakes as soon as the holder is done; the backoff stays the upper bound of
// each wait, so a lost message, a reconnect or a moved slot costs at most
// one backoff. A [redis.Ring] has no notifications: its waiters poll.
//
// # Early refresh and stale values
//
// Records carry their load duration and logical expiry. With early refresh
// ([WithEarlyRefresh], on by default) a hit close to the expiry reloads the
// value in the background under the same lock and fenced commit, once per
// key across processes, at a moment drawn as in XFetch (Vattani et al., VLDB
// 2015) once per stored value for all processes, at least one load duration
// before the expiry; callers keep getting the current value. With [WithStale] a value
// past its TTL is still served while one refresh runs, and while the
// database fails (retried once per [WithStaleThrottle]); [WithResultInfo]
// tells a caller it got a stale value.
//
// # Other entry points
//
// [Cache.Get] reads without loading, [Cache.Set] writes through and wins
// over any load in flight, [Cache.GetOrLoadMany] loads a batch with one
// pipelined read and one loader call, and a loader may choose its value's
// TTL ([SetTTL]) or keep it out of the cache ([DoNotCache]).
// [WithObserver] reports every step for metrics; the otel module turns them
// into OpenTelemetry metrics.
//
// # Storage
//
// The value lives at exactly the key (after [WithPrefix]), so other programs
// can read or delete it. Its bytes are a record: a format version byte, a
// flags byte, a metadata length byte, the metadata (12 bytes of freshness
// when early refresh or stale serving is on), then the [Codec]'s bytes (JSON
// by default). A value this version cannot read (another program's data, a
// newer format, bytes the codec rejects) counts as a miss and is replaced by
// the next load.
//
// The load lock of a value key K is "{T}:stampede:lock:K" ([LockKey]), where
// T is a short string that Redis Cluster hashes to K's slot: the lock is in
// the value's slot, distinct for every value key, and no value key may take
// that shape ([ErrReservedKey]). Its value is a 128-bit random token. Every
// script that touches a lock names the value key first, so a [redis.Ring]
// keeps a value and its lock on one shard.
//
// # Guarantees and limits
//
// While the lock holder is alive and reachable, a key is loaded once per TTL
// across all goroutines of all processes. A crashed holder blocks the others
// for at most the lock TTL ([WithLockTTL]) plus one backoff; a holder frozen
// past its lease can never overwrite a newer value, but a second load can
// then run meanwhile. The lock is a single Redis key: on a failover of a
// replicated Redis, a lock not yet copied to the replica is lost, and one
// extra load can run. A GetOrLoad that begins after a Delete (or Set)
// returned, in any process, never returns the value that Delete removed nor
// a value loaded before it.
//
// When Redis cannot be reached, [FailOpen] (the default) calls the loader
// without the lock, once per key per process at a time, and returns its
// value uncached; [FailClosed] returns the error. After 5 consecutive
// outages a circuit breaker skips Redis for a second at a time
// ([WithCircuitBreaker]). Replies that mean misconfiguration (NOAUTH,
// WRONGPASS, NOPERM, an unknown command, a cluster reply to a plain client)
// are returned under every policy; transient cluster states (TRYAGAIN, a
// migrating slot, CLUSTERDOWN, LOADING) are waited out within the retry
// budget. A flight's GET, and then its miss path, are each bounded by the
// load timeout. Errors the cache absorbs go to [WithErrorHook].
//
// A Cache is safe for concurrent use by many goroutines. For a lock on its
// own (one instance at a time runs a job), see package
// github.com/stampede-go/stampede/lock.
package cache
