// Package cache is a Redis read-through cache that loads a missing key once,
// however many goroutines and processes ask for it at the same moment.
//
// A hot key that expires, or a cold start, sends every concurrent request to
// the database at once: a cache stampede. [Cache.GetOrLoad] lets exactly one
// caller across all processes sharing the Redis load the value; the others
// wait for it and read it from Redis.
//
// # Protocol
//
// For one key, [Cache.GetOrLoad] does the following.
//
//  1. Merge. Callers of the key in this process join one flight
//     (golang.org/x/sync/singleflight) before Redis is touched, so a hot key
//     costs one GET per flight, not one per caller. Each caller waits on its
//     own context; the flight runs detached from them, bounded by
//     [WithLoadTimeout]. Each caller decodes its own copy of the value.
//  2. Read. GET key. A hit ends the flight; a cached not-found record gives
//     [ErrNotFound].
//  3. Read or lock. One Lua script returns the value if it is there, else
//     takes the lock with SET lock token NX PX lockTTL. Because the re-read
//     and the lock attempt are one round trip, no commit can slip between
//     them.
//  4. Wait. If another process holds the lock, sleep the backoff (default
//     100ms) and repeat step 3, at most maxRetries times ([WithRetry]), then
//     return [ErrLockNotAcquired].
//  5. Load. Only the lock holder calls the loader. A watchdog extends the
//     lock every lockTTL/3 while it runs, so a slow load does not let a
//     second loader in. A panic in the loader becomes an error.
//  6. Commit, fenced. One Lua script writes the value with its TTL (plus
//     jitter) and deletes the lock, only if the lock still holds this
//     holder's token. A holder that lost its lock (frozen past the lease, or
//     a [Cache.Delete] ran) writes nothing. On a loader error the lock is
//     released at once and nothing is cached; [ErrNotFound] is cached for
//     [WithNotFoundTTL].
//
// # Storage
//
// The value lives at exactly the key (after [WithPrefix]), so other programs
// can read or delete it. Its bytes are a record: a format version byte, a
// flags byte, a metadata length byte (0 today), then the [Codec]'s bytes
// (JSON by default). A value this version cannot read (another program's
// data, a newer format, bytes the codec rejects) counts as a miss and is
// replaced by the next load.
//
// The lock lives at a key in the same Redis Cluster hash slot as the value,
// so the scripts work on a cluster: "{key}:lock"; "key:lock" when the key has
// a hash tag; "{T}:lock:key", with T a short string of the key's slot, when
// the key holds a '}' but no tag. Its value is a 128-bit random token.
//
// # Guarantees and limits
//
// While the lock holder is alive and reachable, a key is loaded once per TTL
// across all goroutines of all processes. A crashed holder blocks the others
// for at most the lock TTL ([WithLockTTL]) plus one backoff; a holder frozen
// past its lease can never overwrite a newer value, but a second load can
// then run meanwhile.
// The lock is a single Redis key: on a failover of a replicated Redis, a lock
// not yet copied to the replica is lost, and one extra load can run.
//
// When Redis fails, [FailOpen] (the default) calls the loader without the
// lock, once per key per process at a time, and returns its value uncached;
// [FailClosed] returns the error. Under FailOpen, a Redis error while another
// process holds the lock also loads without it: one extra load. Each Redis
// call is bounded by the client's read and write timeouts (go-redis
// defaults: 3s); the load timeout bounds a call only if the client has
// ContextTimeoutEnabled set. A loader still running at the load timeout is
// abandoned and its lock released. Errors the cache absorbs (a Redis error
// under FailOpen, a value not stored because its lock was lost) go to
// [WithErrorHook].
//
// A Cache is safe for concurrent use by many goroutines. Use [Obtain] for the
// same lock on its own: one instance runs a scheduled job, a repeated
// submission is refused.
package cache
