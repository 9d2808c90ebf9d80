// This file is the package's public face: the Cache, New, and every
// operation with its documentation; the work is in the files they name.

package cache

import (
	"context"
	"reflect"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/health"
	"github.com/stampede-go/stampede/internal/notify"
	"github.com/stampede-go/stampede/internal/redisio"
	"github.com/stampede-go/stampede/internal/tags"
	"golang.org/x/sync/singleflight"
)

// Cache is a Redis read-through cache of values of type V that loads each
// missing key once across all the processes that share the Redis. It is safe
// for concurrent use; create one per value type and reuse it.
type Cache[V any] struct {
	rdb      redis.UniversalClient
	cfg      config
	cluster  bool               // rdb is a *redis.ClusterClient: Delete sends single-key commands
	deadline clock.Shared       // bounds the GETs of flights
	group    singleflight.Group // merges this process's callers of one key
	calls    sync.Pool          // *flightCall[V]: a caller's request to group
	redisio  *redisio.Client    // sends the commands: flights' GETs coalesced, pipelined rounds
	share    *share             // what the Caches on rdb share (see share)
	brk      *health.Breaker    // share's
	notify   *notify.Notifier   // share's: wakes waiters; nil: they poll
	near     *near[V]           // values kept in memory; nil: off (see WithNearCache)
	legacy   string             // the lease registry of versions before 0.4: a reserved key
	markKeys string             // what writers' marker keys begin with: reserved
	tags     *tags.Versions     // tag versions (see WithTags)
	// quarantine serves keys whose records the codec cannot decode.
	quarantine *quarantine[V]

	refreshing sync.Map       // keys with a background refresh running in this process
	bg         sync.WaitGroup // background refreshes, waited for by Close
	bgMu       sync.Mutex     // orders starting a refresh and Close's wait
	closed     bool           // Close was called; guarded by bgMu
}

// New returns a Cache on rdb, which may be a *redis.Client, *redis.ClusterClient,
// *redis.Ring or failover client. Invalid options panic, naming the option:
// they are programming errors, found at start-up. So does a second value
// type on one prefix: New panics if a Cache of another V is open on the same
// client with the same non-empty prefix (the two would overwrite each
// other's values); a closed Cache frees its prefix. Without a prefix, caches
// of any types share the keyspace, and a record one of them cannot decode is
// reported as [EventDecodeError] (its key is then loaded at most once per
// interval while such records keep coming: see [EventQuarantined]).
//
// Give it a client whose calls end at their context's deadline
// (ContextTimeoutEnabled: true in the go-redis options, with ReadTimeout
// and WriteTimeout of about 100ms): the cache bounds every call by the load
// timeout, but a client without it lets a hung Redis hold each call for its
// own read timeout, and FailOpen never gets to load. New warns once per
// client, through the logger (see [WithLogger]), of a client without it.
//
// Every Cache on the same client (the same pointer) shares one set of
// resources: one subscription per Redis master for its waiters, one circuit
// breaker per breaker setting (see [WithCircuitBreaker]) and what is known
// of Redis's health, so that N caches on one client cost one subscribed
// connection per master and learn of an outage together. The last of them
// to be closed (see [Cache.Close]) releases them.
func New[V any](rdb redis.UniversalClient, opts ...Option) *Cache[V] {
	if rdb == nil {
		panic("cache: New: nil Redis client")
	}
	c := &Cache[V]{rdb: rdb, cfg: newConfig(opts)}
	c.quarantine = newQuarantine[V](c.cfg.ttl)
	c.legacy, c.markKeys = coherence.LegacyRegistryKey(c.cfg.prefix), coherence.MarkKeyPrefix(c.cfg.prefix)
	c.tags = tags.New(rdb, c.cfg.prefix, c.cfg.tags)
	_, c.cluster = rdb.(*redis.ClusterClient)
	c.share = acquire(rdb, &c.cfg, reflect.TypeFor[V]())
	c.brk, c.notify = c.share.brk, c.share.notify
	c.guardTags()
	// A Cache dropped without Close gives its hold back when collected.
	runtime.AddCleanup(c, func(s *share) { go s.release() }, c.share)
	c.redisio = redisio.New(rdb, func() context.Context { return c.deadline.Within(context.Background(), c.cfg.loadTimeout, time.Now()) }, c.cfg.replicaReads)
	if c.cfg.near.enabled() && nearSupported(rdb) {
		c.near = newNear(c)
		runtime.AddCleanup(c, func(n *near[V]) { go n.close() }, c.near) // its connections and goroutines, too
	}
	if c.near != nil {
		c.tags.Track(c.near.track) // versions kept in memory under the near cache's coherence
	}
	return c
}

// GetOrLoad returns the value at key. On a miss it takes the key's load lock,
// calls load, stores the value for the TTL and returns it; callers in other
// processes wait for that value instead of calling load themselves.
//
// Callers of the same key in this process are merged into one flight (one
// Redis read, at most one load); the first caller's load function and context
// values are used for it. The flight runs on a context detached from the
// callers' cancellation and bounded by [WithLoadTimeout]; load receives that
// context. Each caller stops waiting when its own ctx ends and returns
// ctx.Err(), without disturbing the flight. A caller never gets a value that
// a [Cache.Delete] which returned before the caller began has removed, in
// any process: a flight older than the caller is asked again.
//
// opts change this call only (see [CallOption]): [TTL], [ForceRefresh],
// [NoStale]. A ctx already ended when GetOrLoad is called returns ctx.Err()
// at once, without a Redis call or a load.
//
// Every caller gets its own decoded copy of the value. Errors: [ErrEmptyKey],
// [ErrReservedKey], [ErrNilLoader]; an error wrapping [ErrNotFound] and
// naming the key when load (now or within the not-found TTL) returned it,
// the same on every call (see [ErrNotFound]); load's own error unchanged (a panic in load
// becomes a [*PanicError]); an error wrapping [ErrLockNotAcquired], naming
// the key, when the retry budget ran out while another process was loading;
// an error wrapping context.DeadlineExceeded when the load timeout ended the
// wait, the loader or a Redis call; a Redis error under [FailClosed] (or
// [ErrCircuitOpen] while the breaker is open), and under every policy a
// Redis reply that means misconfiguration (NOAUTH, WRONGPASS, NOPERM, an
// unknown command). A loaded value the codec cannot encode is returned
// but not stored ([EventEncodeError], and the error hook once per key).
// Errors the cache absorbs instead of returning go to [WithErrorHook].
func (c *Cache[V]) GetOrLoad(ctx context.Context, key string, load func(ctx context.Context) (V, error), opts ...CallOption) (V, error) {
	return c.getOrLoad(ctx, key, load, parseCall(opts))
}

// GetOrLoadMany returns the values at keys, as [Cache.GetOrLoad] would for
// each, with a few round trips for the whole batch instead of a few per key:
// one pipelined GET for all keys, one pipelined read-or-lock for the misses,
// one call of loadMany for the keys whose load lock this call took, and one
// pipelined fenced commit; keys the near cache holds are answered from
// memory first, and the values read or loaded fill it, as GetOrLoad's do
// (with the same promise). loadMany receives only those keys (the caller's
// keys, without the prefix) and returns the values it found by key; a key it
// leaves out of the map does not exist: it is cached as not found for the
// not-found TTL (see [WithNotFoundTTL]) and left out of the result, as is a
// key whose not-found is already cached. [SetTTL] and [DoNotCache], called
// by loadMany, apply to every key of its call.
//
// Keys that another process (or a GetOrLoad flight of this one) is loading
// are waited for concurrently, each as GetOrLoad waits, and loaded by a
// single-key call of loadMany if that holder fails. While this call loads a
// key, concurrent GetOrLoad callers of the key in this process share its
// result instead of loading it again. Values due for early refresh or
// served stale are refreshed in the background together, by one more call
// of loadMany for those whose refresh this process starts and whose lock no
// other process holds (see [WithStale], [WithSoftLoadTimeout] and
// [WithEarlyRefresh]). Duplicate keys are read and returned once.
//
// The work runs on ctx's values without its cancellation, bounded by
// [WithLoadTimeout]; when ctx ends first, GetOrLoadMany returns nil and
// ctx.Err() at once, the loads going on and being stored for later callers.
//
// opts change this call only: a [TTL] applies to every value loadMany
// returns, [NoStale] makes values past their TTL misses, [ForceRefresh]
// loads every key anew as GetOrLoad would. A ctx already ended returns ctx.Err() at
// once, without a Redis call or a load.
//
// The result holds every value found or loaded. The error, nil when every
// key was answered, joins one error per failed key on one line
// ("; "-separated), each naming its key, each matched with errors.Is and
// errors.As as GetOrLoad's: loadMany's own error (for each key
// it was given; nothing is cached), [ErrLockNotAcquired], a Redis error
// under [FailClosed] or [ErrCircuitOpen]. Under [FailOpen], keys Redis could
// not serve are loaded by the same loadMany call and returned uncached.
// Errors before any work, with a nil map: [ErrNilLoader], and
// [ErrEmptyKey] or [ErrReservedKey] naming the key's index. With [WithResultInfo], Stale is set when
// any value returned was stale. Safe for concurrent use.
func (c *Cache[V]) GetOrLoadMany(ctx context.Context, keys []string, loadMany func(ctx context.Context, keys []string) (map[string]V, error), opts ...CallOption) (map[string]V, error) {
	return c.getOrLoadMany(ctx, keys, loadMany, parseCall(opts))
}

// Get returns the value cached at key without loading it. Errors:
// [ErrCacheMiss] when Redis holds no readable value (absent, expired past
// every grace, or unreadable); [ErrNotFound] when a loader's not-found is
// cached; [ErrEmptyKey], [ErrReservedKey]; [ErrCircuitOpen] while the
// breaker is open; a Redis error wrapped as "cache: redis: ..."; a decoding
// error. A value past its TTL that [WithStale] still serves is returned,
// and marked in [WithResultInfo], unless opts hold [NoStale]; Get never
// refreshes it. Get is not merged with other callers: each call is one GET.
// A ctx already ended returns ctx.Err() at once, without a Redis call.
func (c *Cache[V]) Get(ctx context.Context, key string, opts ...CallOption) (V, error) {
	return c.get(ctx, key, parseCall(opts))
}

// Set stores v at key for the TTL (with jitter), or for the [TTL] in opts,
// as GetOrLoad would after a load: call it after writing the source, when
// the new value is at hand. It wins over a load in flight in any process:
// the load's lock is voided, so the older value it loaded is never stored
// over v, and callers that begin after Set returns get v (or newer), from
// Redis or any near cache. Waiters on the key are woken. With near caches
// it returns once the others acknowledged it: a hop to each and back, up to
// one lease (1s) for a process frozen or cut off, about one lease in the
// first second of a prefix's registry (see docs/GUARANTEES.md). With
// [Version], a Set older than the value stored writes nothing. Errors:
// [ErrEmptyKey], [ErrReservedKey]; [ErrOlderVersion]; an encoding error
// (nothing is written); [ErrCircuitOpen] while the breaker is open
// (nothing is written: the write failed, retry it once Redis answers); a
// Redis error wrapped as "cache: redis: ...". Transient cluster errors
// are retried within the retry budget. A ctx already ended returns
// ctx.Err() at once, writing nothing.
func (c *Cache[V]) Set(ctx context.Context, key string, v V, opts ...CallOption) error {
	return c.set(ctx, key, v, parseCall(opts))
}

// Delete removes the values at keys and their load locks. A load in flight
// for one of them when Delete runs, in any process, finds its lock gone and
// writes nothing, and no GetOrLoad that begins after Delete returns gets the
// removed value or that load's. Keys may be in different cluster slots; on a
// cluster, Delete sends single-key commands (each lock before its value), so
// it also succeeds while a slot migrates. Transient cluster errors are
// retried within the retry budget. With near caches it waits for their
// acknowledgements as [Cache.Set] does. A ctx already ended returns
// ctx.Err() at once, deleting nothing. Errors: [ErrEmptyKey],
// [ErrReservedKey], [ErrCircuitOpen] while the breaker is open (nothing is
// deleted), or a Redis error wrapped as "cache: redis: ...".
func (c *Cache[V]) Delete(ctx context.Context, keys ...string) error {
	return c.delete(ctx, keys)
}

// DeleteByTag removes every value stored with one of tags (see [Tags],
// [AddTags]), in one O(1) write whatever their number and slots, with the
// promise of [Cache.Delete]: a read that begins after it returned, in any
// process, near caches included, gets none of them, nor the value of a load
// that began before it. Each near cache drops the values that carry one of
// tags, and keeps the others. The values stay in
// Redis until their TTL, unreadable (see [WithTags]). A ctx already ended
// returns ctx.Err() at once. Errors: [ErrNoTags] without WithTags (with or
// without tags), an error for an empty tag, [ErrCircuitOpen] while the
// breaker is open, a Redis error wrapped as "cache: redis: ...".
func (c *Cache[V]) DeleteByTag(ctx context.Context, tags ...string) error {
	return c.deleteByTag(ctx, tags)
}

// Clear removes every value of the Cache (its prefix), as FusionCache's
// Clear, with the promise and the O(1) cost of [Cache.DeleteByTag]. It
// needs [WithTags]: records written by a process without it are removed
// too, but only processes with it check for Clear.
func (c *Cache[V]) Clear(ctx context.Context) error {
	return c.deleteVersions(ctx, []string{c.tags.All})
}

// Close gives back the Cache's hold on what the caches on its Redis client
// share (see [New]): the last Cache on a client to close ends the client's
// subscriptions (see docs/PROTOCOL.md, notified waiters). Close then waits
// for the Cache's background refreshes to end; they are bounded by the load
// timeout. Calls made after Close still work, without background refreshes,
// and woken by notification only while another Cache on the client is
// open. Close is safe to call more than once and from several goroutines.
// It always returns nil.
func (c *Cache[V]) Close() error {
	c.bgMu.Lock()
	c.closed = true
	c.bgMu.Unlock()
	c.bg.Wait()
	if c.near != nil {
		c.near.close()
	}
	c.closeWriter()
	// Last: the near cache gives its lease back over the client's shared
	// tracking connections, acknowledging the writes that still counted on it.
	c.share.release()
	return nil
}

// Ping checks that Redis answers, for a readiness probe, past the circuit
// breaker: nil, or an error that names the address and the cause (on a
// cluster or a ring, the node that failed). It costs one PING per node.
func (c *Cache[V]) Ping(ctx context.Context) error {
	return health.Ping(ctx, c.rdb)
}

// Stats returns what the Cache did since [New] in this process (see
// [Stats]), and the state of its breaker and near cache now. It costs a
// near hit one more atomic add; safe for concurrent use.
func (c *Cache[V]) Stats() Stats {
	s := c.cfg.counts.snapshot()
	s.BreakerOpen = c.brk.Open()
	if c.near != nil {
		s.NearEntries, s.NearBytes = int64(c.near.store.EstimatedSize()), int64(c.near.store.WeightedSize())
	}
	return s
}

// Expire makes the value at key expire now, in every process, as
// FusionCache's Expire: the next read loads it anew, under the load lock as
// a miss (callers in other processes wait for that load). Under
// [WithStale] the old value stays as the fallback: a GetOrLoad or
// GetOrLoadMany whose reload fails gets the old value, marked stale (unless
// the call has [NoStale]), and it is kept for the stale throttle; the
// reload keeps the value's tags and TTL. [Cache.Get] returns it as stale.
// Without WithStale, or when key holds no value, Expire is [Cache.Delete].
// A value written while Expire runs (a Set, or a load's commit) is
// expired in turn, as if written before Expire; a value that keeps
// changing is deleted. Like Delete, it voids a load in flight (whatever it
// read before Expire is not stored, even if committed while Expire runs)
// and returns once every near cache dropped the value. Errors: [ErrEmptyKey], [ErrReservedKey],
// [ErrCircuitOpen] while the breaker is open, a Redis error wrapped as
// "cache: redis: ...".
func (c *Cache[V]) Expire(ctx context.Context, key string) error {
	return c.expire(ctx, key)
}
