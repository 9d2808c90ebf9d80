// This file is the near cache: fresh values kept in process memory, bounded by
// bytes, so that a hot key's hit is a memory read instead of a Redis round
// trip. The store is otter (W-TinyLFU admission: a scan of cold keys does not
// flush the hot ones); internal/coherence drops what other writes made old
// and says when memory may be served.

package cache

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/freshness"
	"github.com/stampede-go/stampede/internal/tags"
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
	eventual  bool        // WithEventualNearCache: no lease, nobody waits for this process
	perKey    bool        // WithNearPerKey: strict, with per-key holders where the client allows it
	writer    *nearWriter // WithoutNearCache: confirms the writes; set by validate
}

// on reports whether the Cache keeps a near cache.
func (n *nearConfig) enabled() bool { return !n.off }

// validate checks the near-cache options and fills in the defaults.
func (n *nearConfig) validate() error {
	switch {
	case n.leaseSet && n.lease < 40*time.Millisecond:
		return fmt.Errorf("cache: WithNearLease(%v): a lease shorter than 40ms cannot be renewed reliably", n.lease)
	case !n.leaseSet:
		n.lease = defaultNearLease
	}
	switch {
	case !n.enabled():
		n.writer = &nearWriter{} // its writes still wait for the others' near caches
		return nil
	case n.eventual && n.maxAge <= 0:
		return fmt.Errorf("cache: WithEventualNearCache(%v): maxAge must be positive", n.maxAge)
	case n.set && n.maxBytes <= 0:
		return fmt.Errorf("cache: WithNearCache(%d): maxBytes must be positive", n.maxBytes)
	case n.maxAgeSet && n.maxAge <= 0:
		return fmt.Errorf("cache: WithNearMaxAge(%v): duration must be positive", n.maxAge)
	}
	if !n.set {
		n.maxBytes = defaultNearBytes
	}
	if !n.maxAgeSet {
		n.maxAge = defaultNearMaxAge
	}
	return nil
}

// nearWriter confirms the writes of a Cache without a near cache with the
// near caches of other processes, as a near cache confirms its own: without
// it, a reader's memory could serve the old value for a network delay after
// Set or Delete returned. Its tracker (coherence.NewWriter) holds no lease
// and keeps no memory; it is made at the Cache's first write, and
// subscribes to acknowledgements only once a write has holders to wait for.
type nearWriter struct {
	once  sync.Once
	track *coherence.Tracker // nil: a client the near cache does not support, whose writes are not confirmed
}

// writeTracker returns the tracker that confirms c's writes: its near
// cache's, or the writer's of a Cache made WithoutNearCache, or nil on a
// client the near cache does not support.
func (c *Cache[V]) writeTracker() *coherence.Tracker {
	if c.near != nil {
		return c.near.track
	}
	w := c.cfg.near.writer
	if w == nil {
		return nil // the near cache is off because the client is not supported
	}
	w.once.Do(func() {
		if !nearSupported(c.rdb) {
			return
		}
		cfg, health := c.cfg, c.share.res.health // not c: the tracker must not keep its Cache alive
		w.track = coherence.NewWriter(c.rdb, cfg.prefix, cfg.near.lease, coherence.Hooks{
			OnLapse:  func(holder string) { cfg.emit(EventNearLeaseWait, holder, 0, nil) },
			OnNarrow: func(err error) { health.NearNarrow(cfg.prefix, err) },
			OnWiden:  func() { health.NearWiden(cfg.prefix) },
			Global:   c.tags.Global, // a write of a tag or Clear version waits for every per-key holder
		})
		// Closed by Cache.Close (closeWriter), or when c is collected.
		runtime.AddCleanup(c, func(t *coherence.Tracker) { go t.Close() }, w.track)
	})
	return w.track
}

// closeWriter ends the writer's tracker of a Cache made WithoutNearCache,
// if a write made one; after it, a write makes none.
func (c *Cache[V]) closeWriter() {
	w := c.cfg.near.writer
	if w == nil {
		return
	}
	w.once.Do(func() {}) // a write racing with Close makes its tracker first, or never
	if w.track != nil {
		w.track.Close()
	}
}

// nearEntry is one value in memory.
type nearEntry[V any] struct {
	data    []byte      // the codec's bytes: each caller decodes its own copy
	v       *V          // decoded once, for WithNearShared and for cloners
	until   int64       // clock.Now after which the entry is not served
	tags    []string    // the tags of the record it was read from (see stampHolds)
	checked atomic.Bool // keep found its ticket valid after storing it: not served before
	deps    []string    // the version keys of its tags: DeleteByTag of one drops it
}

// cloner is a value that copies itself: near hits clone instead of decoding.
type cloner[V any] interface{ Clone() V }

// near is a Cache's near cache; it is safe for concurrent use.
type near[V any] struct {
	store  *otter.Cache[string, *nearEntry[V]] // by the caller's key: no prefix to add on a hit
	prefix string
	track  *coherence.Tracker
	perKey bool // Redis reports only the writes of keys read through the tracked readers: keep only those
	holds  bool // strict and per key: each kept read registered this process as its key's holder
	shared bool // hand out e.v itself
	clones bool // *V is a cloner[V]: hand out e.v.Clone()
	maxAge time.Duration

	// byTag finds the keys whose entries carry a tag, by its version key,
	// so that a DeleteByTag drops them alone. A tagged entry is stored and
	// indexed under tmu, and a deleted one unindexed under tmu unless the
	// key holds another entry with the tag: every stored entry with a tag
	// is indexed (an index that names more is only looked at in vain).
	tmu   sync.Mutex
	byTag map[string]map[string]struct{} // version key -> callers' keys; protected by tmu

	closeOnce sync.Once
}

// newNear makes c's near cache. It holds no reference to c (its callbacks
// use a copy of the config), so that a Cache dropped without Close can be
// collected, and its cleanup can close the near cache.
//
// A Cache whose reads go to replicas of a cluster could keep nothing (see
// keep) and gets none (nil): as one made WithoutNearCache, it holds no
// lease that writers would wait for and opens no tracking connection,
// while its writes are still confirmed with the others' near caches.
func newNear[V any](c *Cache[V]) *near[V] {
	if c.cfg.replicaReads && c.cluster {
		c.cfg.near.off, c.cfg.near.writer = true, &nearWriter{}
		return nil
	}
	cfg := c.cfg
	n := &near[V]{shared: c.cfg.near.shared, maxAge: c.cfg.near.maxAge, prefix: c.cfg.prefix, byTag: map[string]map[string]struct{}{}}
	if holdsPerKey(c) {
		n.maxAge = min(n.maxAge, coherence.HoldKeep) // no value outlives the registration writers wait on
	}
	_, n.clones = any((*V)(nil)).(cloner[V])
	n.store = newNearStore(cfg, n)
	n.track = startTracker(c, n, cfg)
	if n.perKey {
		c.redisio.TrackReads(n.track.ReadVia)
	}
	return n
}

// newNearStore makes n's store, bounded by bytes, which reports
// evictions and keeps n's tag index.
func newNearStore[V any](cfg config, n *near[V]) *otter.Cache[string, *nearEntry[V]] {
	return otter.Must(&otter.Options[string, *nearEntry[V]]{
		MaximumWeight: uint64(cfg.near.maxBytes),
		Weigher: func(k string, e *nearEntry[V]) uint32 {
			return uint32(min(len(k)+len(e.data)+nearEntryOverhead, math.MaxUint32))
		},
		ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, *nearEntry[V]]) time.Duration {
			return max(time.Duration(e.Value.until-clock.Now()), time.Nanosecond)
		}),
		OnDeletion: func(e otter.DeletionEvent[string, *nearEntry[V]]) {
			if e.Cause == otter.CauseOverflow {
				cfg.emit(EventNearEviction, cfg.prefix+e.Key, 0, nil) // the store's keys are the callers'
			}
			if len(e.Value.deps) > 0 {
				n.unindex(e.Key, e.Value)
			}
		},
	})
}

// startTracker starts n's tracker on the hub of c's client: strict (per
// key with WithNearPerKey where the client allows it), or eventual, per key
// where the client allows it (n.perKey). Its hooks use
// cfg, a copy, not c: the near cache must not keep its Cache alive.
func startTracker[V any](c *Cache[V], n *near[V], cfg config) *coherence.Tracker {
	health, tags := c.share.res.health, c.tags
	hub := c.share.res.nearHub() // one tracking connection per master for every Cache on the client
	track := hub.New
	switch {
	case holdsPerKey(c):
		n.perKey, n.holds = true, true
		go warnIfEvicting(c.rdb, func(addr, policy string) { health.NearPerKeyEvicts(cfg.prefix, addr, policy) })
		track = func(prefix string, lease time.Duration, hooks coherence.Hooks) *coherence.Tracker {
			return hub.NewHolder(prefix, tags.Base(), lease, hooks)
		}
	case cfg.near.eventual && perKeySupported(c.rdb):
		n.perKey = true
		track = func(prefix string, lease time.Duration, hooks coherence.Hooks) *coherence.Tracker {
			return hub.NewPerKey(prefix, tags.Base(), lease, hooks)
		}
	case cfg.near.eventual:
		track = hub.NewEventual
	}
	return track(cfg.prefix, cfg.near.lease, coherence.Hooks{
		OnDrop:    func(key string, all bool) { n.drop(&cfg, tags, key, all) },
		OnLapse:   func(holder string) { cfg.emit(EventNearLeaseWait, holder, 0, nil) },
		OnRefused: func(err error) { health.NearRefused(cfg.prefix, err) },
		OnNarrow:  func(err error) { health.NearNarrow(cfg.prefix, err) },
		OnWiden:   func() { health.NearWiden(cfg.prefix) },
		Global:    tags.Global,
		Forget:    tags.ForgetKey,
	})
}

// get returns the value of the caller's key (without the prefix) from
// memory, if it is there, fresh, carries every one of tags, and the tracker
// is serving (sure of its invalidations, its lease running).
func (n *near[V]) get(c *Cache[V], key string, tags []string) (v V, ok bool) {
	if !n.track.Serving() || c.brk.Open() {
		return v, false
	}
	e, ok := n.store.GetIfPresent(key)
	now := clock.Now()
	if !ok || now >= e.until || !e.checked.Load() || !holdsTags(e.tags, tags) {
		return v, false
	}
	yieldIfDue(now)
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
// lands between a check and a store could otherwise leave an old value. The
// entry is served only once the check passed.
func (n *near[V]) keep(c *Cache[V], key string, tk coherence.Ticket, r *result[V]) {
	if !tk.OK() || r.notFound != nil || r.data == nil || r.stale || r.throttled || r.freshness.Expiry.IsZero() || n.perKey && !r.tracked {
		return
	}
	// (Never a replica's copy, which may be older than invalidations this
	// process has already seen, from masters: kept, it would outlive the
	// replica's lag. Such a Cache has no near cache: see newNear.)
	left := time.Until(r.freshness.Expiry) // a wall-clock expiry, as Redis's own
	if c.cfg.beta > 0 {
		left -= freshness.Lead(c.cfg.beta, r.freshness, r.head)
	}
	left = min(left, n.maxAge)
	if n.holds {
		left = min(left, coherence.HoldKeep-tk.Age()) // within the registration the read relied on
	}
	if left <= 0 {
		return
	}
	e := &nearEntry[V]{data: r.data, until: clock.Now() + int64(left)}
	if r.stamp != nil {
		e.tags = r.stamp.Tags
	}
	if n.shared || n.clones {
		v, err := c.decodeCopy(r.data)
		if err != nil {
			return
		}
		e.v = &v
	}
	local := strings.Clone(key[len(n.prefix):]) // not a slice that keeps the prefixed key alive
	if r.stamp != nil && len(r.stamp.Tags) > 0 {
		e.deps = c.tags.Keys(r.stamp.Tags)
		n.storeTagged(local, e)
	} else {
		n.store.Set(local, e)
	}
	if n.track.Valid(tk) {
		// Served only from now on: between the store and the check, a read
		// that began after a write returned could otherwise get an entry
		// whose check is about to fail.
		e.checked.Store(true)
		return
	}
	n.store.ComputeIfPresent(local, func(old *nearEntry[V]) (*nearEntry[V], otter.ComputeOp) {
		if old == e {
			return nil, otter.InvalidateOp
		}
		return old, otter.CancelOp
	})
}

// drop is the tracker's OnDrop: key (the Redis key, prefix included) was
// written, or with all, memory may hold what a version key or everything
// made current (key "": invalidations could have been missed).
func (n *near[V]) drop(cfg *config, versions *tags.Versions, key string, all bool) {
	if all && key != "" { // a version: Forget dropped it from memory
		switch everything, tagged := versions.Depends(key); {
		case tagged: // a DeleteByTag: the values with the tag
			n.dropTagged(cfg, key)
			return
		case !everything: // the clock: no value depends on it
			return
		}
	}
	if all {
		versions.Forget()
		if n.store.EstimatedSize() > 0 { // not the drops of an empty cache (at start, say)
			n.store.InvalidateAll()
			if key != "" { // a Clear: a write, not invalidations that could have been missed
				cfg.emit(EventNearInvalidation, key, 0, nil)
			} else {
				cfg.emit(EventNearDrop, "", 0, nil)
			}
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
}

// storeTagged stores e, which carries tags, at local, and indexes it.
func (n *near[V]) storeTagged(local string, e *nearEntry[V]) {
	n.tmu.Lock()
	defer n.tmu.Unlock()
	for _, d := range e.deps {
		m := n.byTag[d]
		if m == nil {
			m = map[string]struct{}{}
			n.byTag[d] = m
		}
		m[local] = struct{}{}
	}
	n.store.Set(local, e) // under tmu: an unindex cannot run between the two
}

// unindex forgets that local holds e, deleted, unless local holds another
// entry with the same tags.
func (n *near[V]) unindex(local string, e *nearEntry[V]) {
	n.tmu.Lock()
	defer n.tmu.Unlock()
	cur, ok := n.store.GetEntryQuietly(local)
	for _, d := range e.deps {
		if ok && slices.Contains(cur.Value.deps, d) {
			continue
		}
		if m := n.byTag[d]; m != nil {
			delete(m, local)
			if len(m) == 0 {
				delete(n.byTag, d)
			}
		}
	}
}

// dropTagged drops the entries that carry the tag of version key vkey,
// which a DeleteByTag just changed. Reads in flight are void already (see
// coherence.Hooks.Global): an entry stored after the index was taken
// fails its check.
func (n *near[V]) dropTagged(cfg *config, vkey string) {
	n.tmu.Lock()
	m := n.byTag[vkey]
	delete(n.byTag, vkey)
	n.tmu.Unlock()
	for local := range m {
		dropped := false
		n.store.ComputeIfPresent(local, func(old *nearEntry[V]) (*nearEntry[V], otter.ComputeOp) {
			if dropped = slices.Contains(old.deps, vkey); dropped {
				return nil, otter.InvalidateOp
			}
			return old, otter.CancelOp
		})
		if dropped {
			cfg.emit(EventNearInvalidation, n.prefix+local, 0, nil)
		}
	}
}

func (n *near[V]) close() {
	if n == nil { // the cleanup of a Cache that got none (see newNear)
		return
	}
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

// holdsPerKey reports whether c's near cache is strict with per-key holders
// (WithNearPerKey): on a client that allows it, and a prefix whose marker
// keys and tag versions share a prefix of their own (see
// coherence.HolderBroadcast; not one with a '{' that opens no hash tag).
func holdsPerKey[V any](c *Cache[V]) bool {
	if !c.cfg.near.perKey || c.cfg.near.eventual || !perKeySupported(c.rdb) {
		return false
	}
	b := coherence.HolderBroadcast(c.tags.Base(), c.markKeys)
	return len(b) > len(c.cfg.prefix) && strings.HasPrefix(b, c.cfg.prefix)
}

// warnIfEvicting calls warn for each master of rdb (a *redis.Client or
// *redis.ClusterClient) whose maxmemory-policy may evict the per-key
// holders' records (see WithNearPerKey). Best effort: a server that does
// not answer INFO is not reported.
func warnIfEvicting(rdb redis.UniversalClient, warn func(addr, policy string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		field := func(name string) string {
			_, v, _ := strings.Cut(info, "\n"+name+":")
			v, _, _ = strings.Cut(v, "\n")
			return strings.TrimSpace(v)
		}
		if policy := field("maxmemory_policy"); field("maxmemory") != "0" && policy != "" && policy != "noeviction" {
			warn(c.Options().Addr, policy)
		}
		return nil
	}
	switch r := rdb.(type) {
	case *redis.Client:
		_ = check(ctx, r)
	case *redis.ClusterClient:
		_ = r.ForEachMaster(ctx, check)
	}
}

// perKeySupported reports whether an eventual near cache on rdb can track
// per key: its reads go to nodes whose tracked readers the hub keeps (a
// server or a cluster's masters). A Ring routes reads itself: it tracks by
// prefix.
func perKeySupported(rdb redis.UniversalClient) bool {
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
		return true
	}
	return false
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
// not yet checked nor prefixed (an invalid key is never in memory). A value
// without one of tags is a miss, as judge says of one read from Redis.
func (c *Cache[V]) nearGet(key string, tags []string) (V, bool) {
	if c.near == nil {
		var zero V
		return zero, false
	}
	v, ok := c.near.get(c, key, tags)
	if ok {
		c.cfg.counts.count(EventNearHit, nil)
		if c.cfg.observer != nil { // the full key, as every event: built only when someone listens
			c.cfg.observe(Event{Kind: EventNearHit, Key: c.cfg.prefix + key})
		}
	}
	return v, ok
}

// yieldEvery is how often near hits give the scheduler a turn (see
// yieldIfDue).
const yieldEvery = 20 * time.Microsecond

// lastYield is when a near hit last yielded, in clock.Now.
var lastYield atomic.Int64

// yieldIfDue yields the processor once per yieldEvery across the process.
// Near hits never block: callers that only hit memory run until the
// scheduler preempts them (10ms each), and goroutines readied by the
// network, the tracker's among them (invalidations, acknowledgements,
// lease renewals), wait in the global run queue, looked at once per 61
// turns: hundreds of milliseconds, which writes in other processes would
// wait for. A yield is a turn.
func yieldIfDue(now int64) {
	if last := lastYield.Load(); now-last >= int64(yieldEvery) && lastYield.CompareAndSwap(last, now) {
		runtime.Gosched()
	}
}
