// This file is what the trackers on one Redis client share: one tracking connection per master, for every prefix.

package coherence

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hub holds the tracking connections of one Redis client, one per master
// (per shard on a Ring), shared by every [Tracker] made on it: N near
// caches on one client cost one subscribed connection per master, not N.
// Each connection tracks every prefix of the hub's trackers in broadcast
// mode and redirects to itself, so that the connection whose subscription
// is confirmed is the one whose tracking is on: losing one loses both, and
// the loss is seen. (A separate tracking connection could close unnoticed
// while its subscriber still heard the writers' markers, and acknowledge
// writes whose invalidations never came.) A subscribed RESP2 connection
// cannot run CLIENT TRACKING, so a prefix that a connection does not track
// yet is added by starting the connection over, which drops the memory of
// every tracker on it, as any loss does: a Cache made while others run
// costs them their memory once. It is safe for concurrent use.
type Hub struct {
	rdb  redis.UniversalClient
	ctx  context.Context // ended by Close
	stop context.CancelFunc
	done sync.WaitGroup
	kick chan struct{} // the trackers changed: sync the nodes now

	mu     sync.Mutex       // protects nodes, each node's sub and confirmed, and started
	nodes  map[string]*node // by address
	start  sync.Once        // starts watch, at the first tracker
	closed atomic.Bool

	// tmu is held for reading while a message is dispatched to trackers,
	// and for writing while they change: once unregister returned, the
	// tracker is never called again. Lock order: tmu, then mu.
	tmu      sync.RWMutex
	trackers []*Tracker
	byChan   map[string][]*Tracker // by marker and acknowledgement channel
	prefixes map[string]int        // the trackers' prefixes, and how many trackers have each
	state    atomic.Pointer[hubState]

	pmu   sync.Mutex    // protects pongs
	pongs chan struct{} // closed at the next lease PONG

	rmu     sync.Mutex                         // serializes changes of readers; protects retired
	readers atomic.Pointer[map[string]*reader] // the nodes' readers by address (see setReader)
	retired map[*reader]*time.Timer            // replaced readers, closed after readerGrace
}

// hubState is what the connections read when they (re)connect, without a
// lock: they may dial while register holds one.
type hubState struct {
	prefixes []string // what to track: no prefix covers another (Redis refuses overlaps); nil: nothing
	channels []string // the invalidations', and every tracker's marker and acknowledgement channels
	trackers []*Tracker
}

// NewHub returns the hub of rdb (a *redis.Client, *redis.ClusterClient or
// *redis.Ring). It opens nothing until a tracker is made on it; it keeps
// one connection per master while it has trackers. Close ends it.
func NewHub(rdb redis.UniversalClient) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{rdb: rdb, ctx: ctx, stop: cancel, kick: make(chan struct{}, 1), nodes: map[string]*node{},
		byChan: map[string][]*Tracker{}, prefixes: map[string]int{}, pongs: make(chan struct{}), retired: map[*reader]*time.Timer{}}
	h.state.Store(&hubState{channels: []string{invalidateChannel}})
	return h
}

// Close closes the hub's connections and waits for its goroutines. Its
// trackers stop serving memory: close them too.
func (h *Hub) Close() {
	if h.closed.Swap(true) {
		return
	}
	h.stop()
	h.mu.Lock()
	for _, n := range h.nodes {
		h.stopNode(n)
	}
	h.nodes = map[string]*node{}
	h.mu.Unlock()
	h.closeRetired()
	h.done.Wait()
	h.dropAll(true)
}

// ConnIDs returns the CLIENT ID of each tracking connection (0 for one not
// connected yet), for operators and tests.
func (h *Hub) ConnIDs() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]int64, 0, len(h.nodes))
	for _, n := range h.nodes {
		ids = append(ids, n.id.Load())
	}
	return ids
}

// register makes t hear its prefix's invalidations and its channels on
// every connection: subscribed at once where the connection tracks the
// prefix already, else by starting the connection over.
func (h *Hub) register(t *Tracker) {
	h.tmu.Lock()
	h.trackers = append(h.trackers, t)
	for _, p := range t.broadcasts() {
		h.prefixes[p]++
	}
	for _, ch := range t.ownChannels() {
		h.byChan[ch] = append(h.byChan[ch], t)
	}
	h.publish()
	ctx, cancel := context.WithTimeout(h.ctx, checkEvery)
	defer cancel()
	h.mu.Lock()
	t.nnodes.Store(int32(len(h.nodes)))
	for _, n := range h.nodes {
		if t.coveredBy(n.trackedPrefixes()) {
			_ = n.sub.Subscribe(ctx, t.ownChannels()...) // on failure go-redis subscribes again when it reconnects
		} else {
			restart(n)
		}
		if t.perKey && n.subbed.Load() && n.reader.Load() == nil {
			h.bindReader(n, n.base) // the first per-key tracker: nothing read through a reader yet
		}
	}
	h.mu.Unlock()
	h.tmu.Unlock()
	h.start.Do(func() {
		h.done.Add(1)
		go h.watch(h.ctx)
	})
	h.poke()
}

// unregister forgets t: it is never called again once this returns. Its
// prefix stays tracked until the connection starts over (extra
// invalidations that nobody hears cost less than a drop of everything).
func (h *Hub) unregister(t *Tracker) {
	h.tmu.Lock()
	h.trackers = slices.DeleteFunc(h.trackers, func(o *Tracker) bool { return o == t })
	for _, p := range t.broadcasts() {
		if h.prefixes[p]--; h.prefixes[p] <= 0 {
			delete(h.prefixes, p)
		}
	}
	var gone []string
	for _, ch := range t.ownChannels() {
		if h.byChan[ch] = slices.DeleteFunc(h.byChan[ch], func(o *Tracker) bool { return o == t }); len(h.byChan[ch]) == 0 {
			delete(h.byChan, ch)
			gone = append(gone, ch)
		}
	}
	h.publish()
	h.mu.Lock()
	if t.perKey && !h.hasPerKey() { // the last one: what the readers read need not be tracked
		for _, n := range h.nodes {
			h.stopReader(n)
		}
	}
	for _, n := range h.nodes {
		if len(gone) == 0 {
			break // (no channels would unsubscribe every one)
		}
		_ = n.sub.Unsubscribe(h.ctx, gone...)
		for _, ch := range gone {
			delete(n.confirmed, ch)
		}
	}
	h.mu.Unlock()
	h.tmu.Unlock()
	h.poke() // the last tracker gone: the connections close
}

// poke asks watch to sync the nodes now.
func (h *Hub) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// publish stores the state the connections read; h.tmu is held for writing.
func (h *Hub) publish() {
	chans := []string{invalidateChannel}
	for ch := range h.byChan {
		chans = append(chans, ch)
	}
	slices.Sort(chans[1:])
	h.state.Store(&hubState{prefixes: minimalPrefixes(h.prefixes), channels: chans, trackers: slices.Clone(h.trackers)})
}

// minimalPrefixes returns the prefixes that no other covers, which track
// every key of all of them.
func minimalPrefixes(ps map[string]int) []string {
	all := make([]string, 0, len(ps))
	for p := range ps {
		all = append(all, p)
	}
	slices.SortFunc(all, func(a, b string) int { return len(a) - len(b) })
	var out []string
	for _, p := range all {
		if !covered(p, out) {
			out = append(out, p)
		}
	}
	return out
}

// covered reports whether tracking prefixes reports every key under p.
func covered(p string, prefixes []string) bool {
	for _, q := range prefixes {
		if strings.HasPrefix(p, q) {
			return true
		}
	}
	return false
}

// dropAll drops the memory of every tracker (see Tracker.dropAll).
func (h *Hub) dropAll(lost bool) {
	h.tmu.RLock()
	defer h.tmu.RUnlock()
	h.dropAllLocked(lost)
}

// dropAllLocked is dropAll with h.tmu held.
func (h *Hub) dropAllLocked(lost bool) {
	for _, t := range h.trackers {
		t.dropAll(lost)
	}
}

// settle makes sure each tracker that every node now serves; h.tmu is
// held.
func (h *Hub) settle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.trackers {
		if t.ready.Load() || len(h.nodes) == 0 {
			continue
		}
		all := true
		for _, n := range h.nodes {
			all = all && n.serves(t)
		}
		if all {
			t.becomeSure()
			select { // serve only once the lease is renewed over these connections
			case t.renewNow <- struct{}{}:
			default:
			}
		}
	}
}

// refuse reports err to every tracker (see Tracker.refuse).
func (h *Hub) refuse(err error) error {
	for _, t := range h.state.Load().trackers {
		t.refuse(err)
	}
	return err
}
