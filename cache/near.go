// near.go is the near cache: fresh values kept in process memory, bounded by
// bytes, so that a hot key's hit is a memory read instead of a Redis round
// trip. The store is otter (W-TinyLFU admission: a scan of cold keys does not
// flush the hot ones); internal/coherence drops what other writes made old
// and says when memory may be served.

package cache

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
)

// nearEntryOverhead is what an entry costs besides its key and payload: the
// entry struct, otter's node and its hash-table slot, as measured by
// TestNearCacheStaysWithinItsBudget.
const nearEntryOverhead = 210

// Near-cache defaults.
const (
	// defaultNearBytes is the budget of a Cache's near cache when
	// WithNearCache does not set one: 32 MiB holds about 100,000 entries of
	// a few hundred bytes (each costs its key, its payload and about 210
	// bytes of bookkeeping), which is the hot set of most services, and is
	// small next to a Go service's heap. W-TinyLFU keeps the hot keys within
	// it whatever the size of the keyspace.
	defaultNearBytes  = 32 << 20
	defaultNearMaxAge = 2 * time.Second
	defaultNearLease  = time.Second
)

// WithNearCache sets the byte budget of the near cache (keys, payloads and
// a per-entry overhead counted). The near cache is on by default, with a
// budget of 32 MiB; [WithoutNearCache] turns it off.
//
// The near cache keeps fresh values in process memory, so that hits of hot
// keys need no Redis round trip, and it keeps read-after-write: a
// GetOrLoad or Get that begins after a Delete or Set returned, in any
// process, does not get the old value from memory. Two mechanisms make it
// so:
//
//   - Invalidations: a value is dropped from every process's memory when
//     anything writes or deletes its key in Redis (this library in any
//     process, another program, redis-cli, an expiry or an eviction),
//     through Redis client-side caching in broadcast mode on one extra
//     connection per master. Give the cache a prefix ([WithPrefix]) so that
//     only its own keys are reported.
//   - Leases: Delete and Set return only once every other process whose
//     near cache may hold the key has acknowledged the invalidation, or its
//     coherence lease ([WithNearLease], 1s) has run out; a process serves
//     memory only while its lease runs, and renews it by proving, on its
//     invalidation connections, that it received everything sent before.
//     A write therefore also waits for the acknowledgements: a hop from
//     Redis to each other process and back (on a cluster, one more Redis
//     call too), measured at 3 to 7 round trips on a 2-core machine running
//     every process (BENCHMARKS.md), and up to one lease while a process is
//     frozen or cut off.
//
// Writes by other programs (redis-cli, a script) are dropped as soon as
// their invalidation arrives but are not waited for; nor are the values
// that loads and refreshes store. While a process cannot be sure it
// receives invalidations (a lost or silent connection, a reconnect, a
// change of masters, the circuit breaker open, its lease not renewed), it
// reads through Redis. Nothing is kept longer than its TTL nor than
// [WithNearMaxAge].
//
// Only values whose record carries its expiry are kept: the near cache
// turns on the freshness metadata that early refresh and stale serving use.
// Values due for early refresh and stale values are served through Redis,
// which starts their refresh as without a near cache.
//
// Each caller gets its own copy: decoded from the stored bytes (no network,
// but a decode per hit), or, when V (or *V) has a method Clone() V, a clone
// of the value decoded once, which is much cheaper than a decode;
// [WithNearShared] hands out one decoded value instead. Supported clients:
// *redis.Client (including a failover client), *redis.ClusterClient (a
// connection per master) and *redis.Ring (one per shard); on other
// UniversalClients the near cache is off. Requires Redis 6.0 or later
// (CLIENT TRACKING, and TIME, PUBLISH and INFO in scripts).
func WithNearCache(maxBytes int64) Option {
	return func(c *config) { c.near.set, c.near.off, c.near.maxBytes = true, false, maxBytes }
}

// WithoutNearCache turns the near cache off: every read goes to Redis, and
// Delete and Set return once Redis has applied them, without waiting for
// near caches. Turn it off in every process of a prefix or in none: the
// writes of a process without it do not wait for the near caches of the
// others, which may then serve the old value for a network delay after the
// write returned.
func WithoutNearCache() Option {
	return func(c *config) { c.near.set, c.near.off = false, true }
}

// WithNearMaxAge bounds how long a value stays in the near cache after it
// was read from Redis, whatever its TTL: the longest an old value can be
// served if an invalidation is lost without its connection noticing.
// Default: 2s. It has no effect without the near cache.
func WithNearMaxAge(d time.Duration) Option {
	return func(c *config) { c.near.maxAge, c.near.maxAgeSet = d, true }
}

// WithNearLease sets the coherence lease of the near cache: how long a
// process may serve memory without proving it still receives invalidations,
// and so the longest a write waits for a process that stopped answering
// (frozen, partitioned, its connection killed). Renewed every quarter of it.
// Default: 1s. It has no effect without the near cache.
func WithNearLease(d time.Duration) Option {
	return func(c *config) { c.near.lease, c.near.leaseSet = d, true }
}

// WithNearShared makes near-cache hits return the one decoded value kept in
// memory, shared by every caller, instead of decoding a copy for each: the
// fastest path, for values that callers treat as read-only (a caller that
// modifies a map, slice or pointer in it changes what every other caller
// gets). It has no effect without the near cache.
func WithNearShared() Option {
	return func(c *config) { c.near.shared = true }
}

// nearConfig is the near cache's part of config.
type nearConfig struct {
	set       bool // WithNearCache
	off       bool // WithoutNearCache
	maxBytes  int64
	maxAge    time.Duration // see WithNearMaxAge; set by validate when not given
	maxAgeSet bool
	lease     time.Duration // see WithNearLease; set by validate when not given
	leaseSet  bool
	shared    bool
}

// on reports whether the Cache keeps a near cache.
func (n *nearConfig) on() bool { return !n.off }

// validate checks the near-cache options and fills in the defaults.
func (n *nearConfig) validate() error {
	switch {
	case !n.on():
		return nil
	case n.set && n.maxBytes <= 0:
		return fmt.Errorf("cache: WithNearCache(%d): maxBytes must be positive", n.maxBytes)
	case n.maxAgeSet && n.maxAge <= 0:
		return fmt.Errorf("cache: WithNearMaxAge(%v): duration must be positive", n.maxAge)
	case n.leaseSet && n.lease < 40*time.Millisecond:
		return fmt.Errorf("cache: WithNearLease(%v): a lease shorter than 40ms cannot be renewed reliably", n.lease)
	}
	if !n.set {
		n.maxBytes = defaultNearBytes
	}
	if !n.maxAgeSet {
		n.maxAge = defaultNearMaxAge
	}
	if !n.leaseSet {
		n.lease = defaultNearLease
	}
	return nil
}

// nearEntry is one value in memory.
type nearEntry[V any] struct {
	data  []byte // the codec's bytes: each caller decodes its own copy
	v     *V     // decoded once, for WithNearShared and for cloners
	until int64  // nanotime after which the entry is not served
}

// cloner is a value that copies itself: near hits clone instead of decoding.
type cloner[V any] interface{ Clone() V }

// near is a Cache's near cache; it is safe for concurrent use.
type near[V any] struct {
	store  *otter.Cache[string, *nearEntry[V]] // by the caller's key: no prefix to add on a hit
	prefix string
	track  *coherence.Tracker
	shared bool // hand out e.v itself
	clones bool // *V is a cloner[V]: hand out e.v.Clone()
	maxAge time.Duration

	closeOnce sync.Once
}

// newNear makes c's near cache. It holds no reference to c (its callbacks
// use a copy of the config), so that a Cache dropped without Close can be
// collected, and its cleanup can close the near cache.
func newNear[V any](c *Cache[V]) *near[V] {
	cfg := c.cfg
	n := &near[V]{shared: c.cfg.near.shared, maxAge: c.cfg.near.maxAge, prefix: c.cfg.prefix}
	_, n.clones = any((*V)(nil)).(cloner[V])
	n.store = otter.Must(&otter.Options[string, *nearEntry[V]]{
		MaximumWeight: uint64(c.cfg.near.maxBytes),
		Weigher: func(k string, e *nearEntry[V]) uint32 {
			return uint32(min(len(k)+len(e.data)+nearEntryOverhead, math.MaxUint32))
		},
		ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, *nearEntry[V]]) time.Duration {
			return max(time.Duration(e.Value.until-nanotime()), time.Nanosecond)
		}),
		OnDeletion: func(e otter.DeletionEvent[string, *nearEntry[V]]) {
			if e.Cause == otter.CauseOverflow {
				cfg.emit(EventNearEviction, e.Key, 0, nil)
			}
		},
	})
	health := &c.share.res.health // not c: the near cache must not keep its Cache alive
	n.track = coherence.New(c.rdb, cfg.prefix, cfg.near.lease, coherence.Hooks{
		OnDrop: func(key string, all bool) {
			if all {
				if n.store.EstimatedSize() > 0 { // not the drops of an empty cache (at start, say)
					n.store.InvalidateAll()
					cfg.emit(EventNearDrop, "", 0, nil)
				}
				return
			}
			local, ok := strings.CutPrefix(key, n.prefix)
			if !ok {
				return // another program's key (a cache without a prefix tracks all)
			}
			if _, ok := n.store.Invalidate(local); ok {
				cfg.emit(EventNearInvalidation, key, 0, nil)
			}
		},
		OnLapse: func(holder string) {
			cfg.emit(EventNearLeaseWait, holder, 0, nil)
		},
		OnRefused: func(err error) {
			health.log(slog.LevelError, "cache: near cache not serving: Redis refused a command it needs (see the README's Redis ACLs); reads go to Redis",
				"redis", health.addr, "prefix", cfg.prefix, "err", err)
		},
	})
	return n
}

// get returns the value of the caller's key (without the prefix) from
// memory, if it is there, fresh, and the tracker is serving (sure of its
// invalidations, its lease running).
func (n *near[V]) get(c *Cache[V], key string) (v V, ok bool) {
	if !n.track.Serving() || c.brk.open() {
		return v, false
	}
	e, ok := n.store.GetIfPresent(key)
	if !ok || nanotime() >= e.until {
		return v, false
	}
	switch {
	case n.shared:
		return *e.v, true
	case n.clones:
		return any(e.v).(cloner[V]).Clone(), true
	}
	v, err := c.decodeCopy(e.data)
	return v, err == nil // a copy that does not decode: read through Redis, which reports it
}

// keep stores a fresh result for key (prefix included) read under tk, unless an invalidation of its
// key (or of everything) came since tk was taken. It stores first and checks
// after, removing its own entry if the check fails: an invalidation that
// lands between a check and a store could otherwise leave an old value.
func (n *near[V]) keep(c *Cache[V], key string, tk coherence.Ticket, r *result[V]) {
	if !tk.OK() || r.notFound != nil || !r.hasV && r.data == nil || r.stale || r.throttled || r.fresh.Expiry.IsZero() {
		return
	}
	if c.cfg.replicaReads && c.cluster {
		// A replica's copy may be older than invalidations this process
		// has already seen (they come from masters): kept, it would outlive
		// the replica's lag.
		return
	}
	left := time.Until(r.fresh.Expiry) // a wall-clock expiry, as Redis's own
	if c.cfg.beta > 0 {
		left -= refreshLead(c.cfg.beta, r.fresh, r.head)
	}
	left = min(left, n.maxAge)
	if left <= 0 {
		return
	}
	e := &nearEntry[V]{data: r.data, until: nanotime() + int64(left)}
	if n.shared || n.clones {
		v, err := c.decodeCopy(r.data)
		if err != nil {
			return
		}
		e.v = &v
	}
	local := strings.Clone(key[len(n.prefix):]) // not a slice that keeps the prefixed key alive
	n.store.Set(local, e)
	if !n.track.Valid(tk) {
		n.store.ComputeIfPresent(local, func(old *nearEntry[V]) (*nearEntry[V], otter.ComputeOp) {
			if old == e {
				return nil, otter.InvalidateOp
			}
			return old, otter.CancelOp
		})
	}
}

func (n *near[V]) close() {
	n.closeOnce.Do(func() {
		n.track.Close()
		n.store.InvalidateAll()
		n.store.StopAllGoroutines()
	})
}

// nearSupported reports whether the near cache can track rdb's masters.
func nearSupported(rdb redis.UniversalClient) bool {
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}

// writeConfirmed runs a write of keys (keys[0] names it in errors) within
// the retry budget, outcome classifying its errors, and with a near cache
// its confirmation (coherence.Tracker.Write): on a single server the
// write's commands (pipe) and the confirmation in one pipeline, elsewhere
// the write (direct) and then the confirmation. Once the write is done,
// this process's memory drops keys before the wait for the others.
func (c *Cache[V]) writeConfirmed(ctx context.Context, keys []string, outcome func(error) errClass, pipe func(redis.Pipeliner), direct func() error) error {
	for attempt := 1; ; attempt++ {
		var wait func() error
		var err error
		if c.near != nil {
			wait, err = c.near.track.Write(ctx, pipe, direct)
		} else {
			err = direct()
		}
		if outcome(err) == errNone {
			c.nearDrop(keys...)
			if wait == nil {
				return nil
			}
			if err := wait(); err != nil { // the write is done: say so
				return fmt.Errorf("cache: %q written, but near caches not confirmed: %w", keys[0], err)
			}
			return nil
		}
		if c.classify(err) != errTransient || !c.cfg.retry.wait(ctx, attempt) {
			return fmt.Errorf("cache: redis: %w", err)
		}
	}
}

// nearTicket takes a ticket for a read of key (a zero one without a near
// cache).
func (c *Cache[V]) nearTicket(key string) coherence.Ticket {
	if c.near == nil {
		return coherence.Ticket{}
	}
	return c.near.track.Ticket(key)
}

// nearDrop drops key from this process's memory before a write of it
// returns, and voids reads of it in flight.
func (c *Cache[V]) nearDrop(keys ...string) {
	if c.near == nil {
		return
	}
	for _, k := range keys {
		c.near.track.Invalidate(k)
	}
}

// nearGet is GetOrLoad's first step with a near cache; key is the caller's,
// not yet checked nor prefixed (an invalid key is never in memory).
func (c *Cache[V]) nearGet(key string) (V, bool) {
	if c.near == nil {
		var zero V
		return zero, false
	}
	v, ok := c.near.get(c, key)
	if ok {
		c.cfg.emit(EventNearHit, key, 0, nil)
	}
	return v, ok
}
