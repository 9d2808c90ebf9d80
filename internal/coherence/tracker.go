// This file is the Tracker: its state, its life, and what a near cache asks of it.

package coherence

import (
	"context"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/rediserr"
	"github.com/stampede-go/stampede/internal/token"
)

// stripes is how many invalidation counters the keys share: a read voided
// by an invalidation of another key of its stripe is only not kept.
const stripes = 4096

// checkEvery is how often a tracker pings its quiet connections and, on a
// cluster or Ring, looks for a changed set of masters.
const checkEvery = time.Second

// epoch anchors the tracker's monotonic clock.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// Hooks are what a tracker tells its near cache. A nil hook does nothing.
// They run on the tracker's goroutines (OnDrop also on the goroutine of
// [Tracker.Invalidate]) and should return quickly: invalidations wait
// behind them.
type Hooks struct {
	// OnDrop removes key (the Redis key, prefix included) from memory; with
	// all set, everything when key is "", else what depends on key, a
	// Global key (every read in flight is void by then).
	OnDrop func(key string, all bool)
	// OnLapse reports a holder that a write waited out (its lease ended)
	// instead of hearing its acknowledgement.
	OnLapse func(holder string)
	// OnRefused reports Redis refusing a command the near cache needs (an
	// ACL without it, a renamed command), once until a renewal succeeds:
	// memory is then never served, which nothing else would show.
	OnRefused func(error)
	// OnNarrow reports, once, an ACL refusing the registry's name (a rule
	// that grants the prefix alone, as versions before 0.4 needed): the
	// tracker then uses the registry under the prefix, as those versions
	// did, whose every renewal Redis reports to every process.
	OnNarrow func(error)
	// OnWiden reports that the registry's name, refused before, was granted
	// (the ACL was fixed while the process ran): the tracker uses it again.
	OnWiden func()
	// Global reports keys that values in memory may depend on besides
	// their own (the tag versions): their invalidation voids every read in
	// flight, whose values' dependencies are not known yet, calls Forget,
	// voids every read in flight again, and calls OnDrop(key, true) to drop
	// the values that depend on key.
	Global func(key string) bool
	// Forget drops what memory holds of a Global key (its value). It runs
	// between two voids of every read in flight: a read that took its
	// ticket after the first may have used what memory held of the key,
	// and the second voids it.
	Forget func(key string)
}

// Tracker is the coherence side of one near cache: it tracks invalidations,
// holds the process's coherence lease, acknowledges other writers' markers
// and confirms this process's writes. A writer's tracker ([NewWriter])
// only confirms writes, for a process without a near cache. It is safe for
// concurrent use.
type Tracker struct {
	rdb    redis.UniversalClient
	prefix string
	seed   maphash.Seed
	hooks  Hooks

	gens    [stripes]atomic.Uint64 // per stripe: invalidations seen
	epoch   atomic.Uint64          // every drop of everything
	ready   atomic.Bool            // every node is subscribed and nothing is in doubt
	smu     sync.Mutex             // protects sureCh; held while ready turns true
	sureCh  chan struct{}          // closed when ready next turns true; nil: nobody waits
	closing bool                   // Close began: never ready again; protected by smu

	hub       *Hub         // its tracking connections, shared with the other trackers of its client
	ownHub    bool         // made by New or NewEventual: Close closes it
	nnodes    atomic.Int32 // the hub's connections, as many as a marker must come on
	stop      context.CancelFunc
	done      sync.WaitGroup
	stopRenew context.CancelFunc // ends renewLoop alone, before the lease is given back
	renewDone chan struct{}      // closed when renewLoop returned

	// The holder's side: the lease and the acknowledgements.
	id         string        // names this holder's lease and its acknowledgement channel
	registry   string        // RegistryKey(prefix)
	legacy     string        // LegacyRegistryKey(prefix); a per-key holder's: RegistryKey(prefix), where it mirrors its lease
	narrow     atomic.Bool   // an ACL refused registry: legacy alone
	narrowAt   atomic.Int64  // nanotime of the last refusal or try of registry (see registries)
	markCh     string        // where writers' markers come (cluster, Ring; anywhere when asked again)
	markKeys   string        // what writers' marker keys begin with (single server)
	lease      time.Duration // the coherence lease
	leaseUntil atomic.Int64  // nanotime until which memory may be served
	renewNow   chan struct{} // the tracker became ready: renew at once
	refused    atomic.Bool   // a refusal was reported, and no renewal succeeded since
	mmu        sync.Mutex    // protects marks
	marks      map[string]*markSeen
	acks       chan string // markers to acknowledge

	// The writer's side: confirmations.
	ackCh   string        // where this writer's acknowledgements come
	seq     atomic.Uint64 // this writer's writes
	pmu     sync.Mutex    // protects pending
	pending map[string]*confirmation

	// A writer without a near cache (NewWriter): no tracking connections,
	// no lease; its acknowledgements come on a subscription of its own.
	writerOnly bool
	sub        ackSub

	// An eventual near cache (NewEventual): tracking connections, no lease,
	// no acknowledgements.
	eventual bool

	// A per-key near cache (NewPerKey): eventual, and Redis reports to it
	// only the writes of the keys it read through the readers, and every
	// write of the keys under globals (the tag and Clear versions).
	perKey  bool
	globals string

	// A strict per-key near cache (NewHolder): per-key tracking, a lease in
	// the per-key registry, and markers on a channel of its own, which
	// writers publish only for the keys it holds (see holders.go).
	holdCh     string
	registered sync.Map // key -> nanotime of this holder's last registration sent (see registrar)
	sweptAt    int64    // nanotime registered was last swept; the renewals' goroutine's

	// The writer's side of per-key holders: when an ACL last refused the
	// per-key registry to a write's confirmation (0: never); writes then
	// confirm as earlier versions did, asking again every RegistryRetry.
	holdRefusedAt atomic.Int64
}

// New starts the tracker of a near cache of the keys under prefix on rdb (a
// *redis.Client, *redis.ClusterClient or *redis.Ring), with a coherence
// lease of leaseLen, on tracking connections of its own. Memory may be
// served once [Tracker.Serving] says so. Close ends its connections and
// goroutines. [Hub.New] shares the connections of a client instead.
func New(rdb redis.UniversalClient, prefix string, leaseLen time.Duration, hooks Hooks) *Tracker {
	t := NewHub(rdb).New(prefix, leaseLen, hooks)
	t.ownHub = true
	return t
}

// New starts the tracker of a near cache of the keys under prefix on the
// hub's client, as [New] does, on the hub's tracking connections. Close the
// tracker before the hub.
func (h *Hub) New(prefix string, leaseLen time.Duration, hooks Hooks) *Tracker {
	return h.startStrict(prefix, leaseLen, hooks, nil)
}

// startStrict starts a strict tracker, set up by setup (nil: nothing) before
// it runs: its renewals and acknowledgements, then its registration with
// the hub.
func (h *Hub) startStrict(prefix string, leaseLen time.Duration, hooks Hooks, setup func(*Tracker)) *Tracker {
	t, ctx := newTracker(h.rdb, prefix, leaseLen, hooks)
	t.hub = h
	if setup != nil {
		setup(t)
	}
	t.renewNow, t.acks = make(chan struct{}, 1), make(chan string, 4096)
	rctx, stopRenew := context.WithCancel(ctx)
	t.stopRenew, t.renewDone = stopRenew, make(chan struct{})
	t.done.Add(2)
	go t.renewLoop(rctx)
	go t.ackLoop(ctx)
	h.register(t)
	return t
}

// NewEventual starts the tracker of an eventually coherent near cache: its
// invalidations are tracked as [New]'s are, but it holds no lease and
// acknowledges no marker, so no writer waits for it, and memory may be
// served whenever it is sure of its connections. A value replaced
// elsewhere is dropped when its invalidation arrives; the near cache bounds
// how long an entry is kept, the only bound left when an invalidation is
// lost unnoticed. Its own writes ([Tracker.Write]) still wait for the
// holders of the prefix, so that their promise holds whoever writes.
func NewEventual(rdb redis.UniversalClient, prefix string, leaseLen time.Duration, hooks Hooks) *Tracker {
	t := NewHub(rdb).NewEventual(prefix, leaseLen, hooks)
	t.ownHub = true
	return t
}

// NewEventual is [NewEventual] on the hub's tracking connections.
func (h *Hub) NewEventual(prefix string, leaseLen time.Duration, hooks Hooks) *Tracker {
	t, _ := newTracker(h.rdb, prefix, leaseLen, hooks)
	t.hub = h
	t.eventual = true
	t.leaseUntil.Store(math.MaxInt64) // no lease to wait for: Serving follows the connections alone
	t.renewNow = make(chan struct{}, 1)
	h.register(t)
	return t
}

// NewPerKey starts the tracker of an eventual near cache, as
// [Hub.NewEventual] does, whose tracking is per key: Redis reports to it the
// writes of the keys read through [Tracker.ReadVia] (and only while the
// connection that read them lives), so a write costs the processes that
// read its key, not every process of the prefix. The keys that begin with
// globals, read once and kept for every value (the tag and Clear versions),
// are tracked for every write. Only replies read through the readers may
// be kept.
func (h *Hub) NewPerKey(prefix, globals string, leaseLen time.Duration, hooks Hooks) *Tracker {
	t, _ := newTracker(h.rdb, prefix, leaseLen, hooks)
	t.hub = h
	t.eventual, t.perKey, t.globals = true, true, globals
	t.leaseUntil.Store(math.MaxInt64)
	t.renewNow = make(chan struct{}, 1)
	h.register(t)
	return t
}

// NewHolder starts the tracker of a strictly coherent near cache, as
// [Hub.New] does, whose tracking is per key, as [Hub.NewPerKey]'s: it
// reads through the readers, and each read that it may keep first
// registers it as a holder of the key ([HoldersKey]). A write of a key
// waits only for that key's holders (each at most until its lease ends),
// and a write of a key nobody holds for nobody; writes of the keys under
// globals wait for every holder. Its lease is in [HoldRegistryKey], and in
// [RegistryKey] too while that exists, where writers of earlier versions
// and holders that track by prefix wait for everyone.
func (h *Hub) NewHolder(prefix, globals string, leaseLen time.Duration, hooks Hooks) *Tracker {
	return h.startStrict(prefix, leaseLen, hooks, func(t *Tracker) {
		t.perKey, t.globals = true, globals
		t.registry, t.legacy = HoldRegistryKey(prefix), RegistryKey(prefix)
		t.holdCh = holdChannel(prefix, t.id)
	})
}

// broadcasts are the prefixes whose every write the tracker must hear: its
// own; or a per-key tracker's globals, and a strict one's marker keys,
// which writers use where holders track by prefix (see confirm_keys.lua),
// as one prefix that covers both (see HolderBroadcast).
func (t *Tracker) broadcasts() []string {
	switch {
	case t.holdCh != "":
		return []string{HolderBroadcast(t.globals, t.markKeys)}
	case t.perKey:
		return []string{t.globals}
	}
	return []string{t.prefix}
}

// HolderBroadcast is what a strict per-key tracker whose globals begin with
// globals tracks by broadcast: the longest prefix of both globals and
// markKeys (its prefix's [MarkKeyPrefix]). One prefix, because Redis sends
// a turn's broadcast invalidations prefix by prefix in the prefixes' order:
// a marker key tracked under a prefix of its own could come before the
// invalidation of a global key written before it ("…:stampede:mark:" sorts
// before "…:stampede:tag"). A prefix whose marker keys and globals share
// nothing beyond the prefix itself (a '{' that opens no hash tag) gets ""
// here: such a near cache tracks by prefix.
func HolderBroadcast(globals, markKeys string) string {
	n := 0
	for n < len(globals) && n < len(markKeys) && globals[n] == markKeys[n] {
		n++
	}
	return globals[:n]
}

// coveredBy reports whether tracking prefixes reports every key t needs.
func (t *Tracker) coveredBy(prefixes []string) bool {
	for _, p := range t.broadcasts() {
		if !covered(p, prefixes) {
			return false
		}
	}
	return true
}

// newTracker makes a tracker that runs nothing yet, and the context that
// Close ends.
func newTracker(rdb redis.UniversalClient, prefix string, leaseLen time.Duration, hooks Hooks) (*Tracker, context.Context) {
	if hooks.OnDrop == nil {
		hooks.OnDrop = func(string, bool) {}
	}
	if hooks.OnLapse == nil {
		hooks.OnLapse = func(string) {}
	}
	if hooks.OnRefused == nil {
		hooks.OnRefused = func(error) {}
	}
	if hooks.OnNarrow == nil {
		hooks.OnNarrow = func(error) {}
	}
	if hooks.OnWiden == nil {
		hooks.OnWiden = func() {}
	}
	if hooks.Forget == nil {
		hooks.Forget = func(string) {}
	}
	if hooks.Global == nil {
		hooks.Global = func(string) bool { return false }
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Tracker{
		rdb: rdb, prefix: prefix, seed: maphash.MakeSeed(), hooks: hooks, stop: cancel,
		id: token.NewToken(), registry: RegistryKey(prefix), legacy: LegacyRegistryKey(prefix), markCh: markChannel(prefix), markKeys: MarkKeyPrefix(prefix),
		lease: leaseLen, marks: map[string]*markSeen{}, pending: map[string]*confirmation{},
	}
	t.ackCh = ackChannel(prefix, t.id)
	return t, ctx
}

// Close stops serving memory and renewing the lease, gives the lease back
// and acknowledges the writes that counted on it (see resign), then closes
// its tracking connections and waits for its goroutines. Writers do not
// wait for a process that no longer serves memory. A writer's tracker
// closes its acknowledgement subscription.
func (t *Tracker) Close() {
	if t.writerOnly {
		t.closeWriter()
		return
	}
	t.smu.Lock()
	t.closing = true     // a subscription confirmed from here on does not make it sure again
	t.ready.Store(false) // nothing served from here on, before the lease is given back
	t.smu.Unlock()
	if t.stopRenew != nil { // no renewal writes the registry or extends the lease past this
		t.stopRenew()
		<-t.renewDone
	}
	t.leaseUntil.Store(0)
	if !t.eventual { // (it never registered)
		t.resign()
	}
	t.stop() // ackLoop sends what is queued before it returns
	t.hub.unregister(t)
	if t.ownHub {
		t.hub.Close()
	}
	t.done.Wait()
}

// Serving reports whether memory may be served: the tracker is sure of its
// connections and its lease runs. Two atomic loads and a clock read.
func (t *Tracker) Serving() bool {
	return t.ready.Load() && nanotime() < t.leaseUntil.Load()
}

// Sure reports whether every tracking connection is subscribed and nothing
// is in doubt, lease or not.
func (t *Tracker) Sure() bool { return t.ready.Load() }

// whenSure returns nil if the tracker is sure, else a channel closed once
// it is: its acknowledgement channel is then confirmed on every connection.
func (t *Tracker) whenSure() <-chan struct{} {
	t.smu.Lock()
	defer t.smu.Unlock()
	if t.ready.Load() {
		return nil
	}
	if t.sureCh == nil {
		t.sureCh = make(chan struct{})
	}
	return t.sureCh
}

// becomeSure marks the tracker sure and wakes whoever whenSure answered.
func (t *Tracker) becomeSure() {
	t.smu.Lock()
	defer t.smu.Unlock()
	if t.closing {
		return
	}
	t.ready.Store(true)
	if t.sureCh != nil {
		close(t.sureCh)
		t.sureCh = nil
	}
}

// ID is this process's holder id: its field in the registry.
func (t *Tracker) ID() string { return t.id }

// ConnIDs returns the CLIENT ID of each tracking connection (0 for one not
// connected yet), for operators and tests.
func (t *Tracker) ConnIDs() []int64 { return t.hub.ConnIDs() }

// Ticket is taken before a read is sent; the read's reply may be kept in
// memory only if nothing was invalidated in between (see [Tracker.Valid]):
// the "caching-in-progress" placeholder of Redis client-side caching, by
// counters. The zero Ticket is never valid.
type Ticket struct {
	epoch, gen uint64
	stripe     uint32
	ok         bool  // the tracker was sure when the ticket was taken
	at         int64 // nanotime it was taken
}

// Age is the time since tk was taken, before its read was sent: a per-key
// holder keeps a value at most HoldMaxAge past it (see [HoldMaxAge]).
func (tk Ticket) Age() time.Duration { return time.Duration(nanotime() - tk.at) }

// OK reports whether the tracker was sure of its invalidations when tk was
// taken: a reply read under a ticket that is not OK is never kept.
func (tk Ticket) OK() bool { return tk.ok }

func (t *Tracker) stripe(key string) uint32 {
	return uint32(maphash.String(t.seed, key) % stripes)
}

// Ticket returns a ticket for a read of key (prefix included) about to be
// sent.
func (t *Tracker) Ticket(key string) Ticket {
	s := t.stripe(key)
	tk := Ticket{epoch: t.epoch.Load(), gen: t.gens[s].Load(), stripe: s, at: nanotime()}
	tk.ok = t.ready.Load()
	return tk
}

// Valid reports whether a reply read under tk may be kept: the tracker was
// and is still sure, and neither the key's stripe nor everything was
// invalidated since. Store the reply first and check after, removing it if
// the check fails: an invalidation that lands between a check and a store
// could otherwise leave an old value. It takes no lock, so it may be called
// while holding one that OnDrop needs.
func (t *Tracker) Valid(tk Ticket) bool {
	return tk.ok && t.ready.Load() && t.epoch.Load() == tk.epoch && t.gens[tk.stripe].Load() == tk.gen
}

// Invalidated reports whether a key of tk's stripe was invalidated since tk
// was taken (drops of everything aside), for tests that wait until an
// invalidation has landed.
func (t *Tracker) Invalidated(tk Ticket) bool { return t.gens[tk.stripe].Load() != tk.gen }

// Invalidate voids reads of key (prefix included) in flight and drops key
// from memory.
func (t *Tracker) Invalidate(key string) {
	if t.hooks.Global != nil && t.hooks.Global(key) {
		t.epoch.Add(1)
		t.hooks.Forget(key)
		t.epoch.Add(1)
		t.hooks.OnDrop(key, true)
		return
	}
	t.gens[t.stripe(key)].Add(1)
	t.hooks.OnDrop(key, false)
}

// dropAll voids every read in flight and empties memory; with lost, memory is
// not served until every node is subscribed again.
func (t *Tracker) dropAll(lost bool) {
	if lost {
		t.ready.Store(false)
	}
	t.epoch.Add(1)
	t.registered.Clear() // a flush or a lost connection may have taken the registrations too: sent again
	t.hooks.OnDrop("", true)
	t.ackAll() // nothing old is left in memory
}

// refuse reports err, once until a renewal succeeds, if it is Redis refusing
// a command the near cache needs. It returns err.
func (t *Tracker) refuse(err error) error {
	if rediserr.Classify(err, false) == rediserr.Fatal && !t.refused.Swap(true) {
		t.hooks.OnRefused(err)
	}
	return err
}

// RegistryRetry is how often a tracker that an ACL narrowed (see narrowed)
// asks for the registry again, so that a rule fixed while the process runs
// is taken up without a restart. A variable for tests.
var RegistryRetry = time.Minute

// registries are the keys of the lease scripts (lease.lua, confirm.lua):
// the registry and the one of earlier versions, or the latter twice once
// an ACL refused the former; then one call every RegistryRetry tries the
// registry again (see narrowed and widened).
func (t *Tracker) registries() []string {
	if at := t.narrowAt.Load(); t.narrow.Load() && nanotime()-at >= int64(RegistryRetry) && t.narrowAt.CompareAndSwap(at, nanotime()) {
		return []string{t.registry, t.legacy}
	}
	return t.inUse()
}

// inUse is registries() without the try of the registry: for calls that a
// refusal would cut short (resign).
func (t *Tracker) inUse() []string {
	if t.narrow.Load() {
		return []string{t.narrowTo(), t.narrowTo()}
	}
	return []string{t.registry, t.legacy}
}

// narrowTo is the registry a narrowed tracker uses alone: the one of
// versions before 0.4, under the prefix (a per-key holder mirrors its
// lease in the prefix's registry, t.legacy, which the ACL refuses too).
func (t *Tracker) narrowTo() string { return LegacyRegistryKey(t.prefix) }

// narrowed reports whether err is an ACL refusing a key to a lease script
// that used the registry (keys, as registries() gave them): then the
// tracker uses the registry of earlier versions alone, and the caller runs
// the script again with registries(). A call that already used the earlier
// versions' registry is not run again.
func (t *Tracker) narrowed(err error, keys []string) bool {
	if keys[0] != t.registry || !refusedKey(err) {
		return false
	}
	t.narrowAt.Store(nanotime())
	if !t.narrow.Swap(true) {
		t.hooks.OnNarrow(err)
	}
	return true
}

// widened notes a lease script that ran on keys (registries() gave them):
// if it used the registry while the tracker was narrowed, the ACL grants
// it now, and the tracker uses it again. Holders still narrowed renew in
// the registry of earlier versions, which this tracker keeps reading and
// renewing while it exists, as during a rolling upgrade.
func (t *Tracker) widened(keys []string) {
	if keys[0] == t.registry && t.narrow.Load() && t.narrow.CompareAndSwap(true, false) {
		t.hooks.OnWiden()
	}
}

// refusedKey reports whether err is an ACL refusing a key of the command
// (not the command itself), as Redis 6 and 7.0 word it ("access one of the
// keys") and Redis 7.2 and Valkey 8 ("access a key").
func refusedKey(err error) bool {
	if err == nil || !redis.HasErrorPrefix(err, "NOPERM") {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "access one of the keys") || strings.Contains(msg, "access a key")
}

// runLease runs a lease script (lease.lua, confirm.lua) on registries(),
// and once more if an ACL refused the registry's name (see narrowed).
func (t *Tracker) runLease(ctx context.Context, script *redis.Script, args ...any) ([]any, error) {
	keys := t.registries()
	reply, err := script.Run(ctx, t.rdb, t.leaseKeys(script, keys), args...).Slice()
	if t.narrowed(err, keys) {
		keys = t.registries()
		reply, err = script.Run(ctx, t.rdb, t.leaseKeys(script, keys), args...).Slice()
	} else if err == nil {
		t.widened(keys)
	}
	return reply, err
}

// leaseKeys are the keys of script run on registries keys: a per-key
// holder's renewal also holds a lease in the registry of versions before
// 0.4 while it exists (see lease.lua), unless it is narrowed to that one.
func (t *Tracker) leaseKeys(script *redis.Script, keys []string) []string {
	if script != leaseScript || t.holdCh == "" || keys[0] != t.registry {
		return keys
	}
	return append(keys[:2:2], t.narrowTo())
}
