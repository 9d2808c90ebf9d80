// coherence.go keeps a near cache coherent with Redis: on every master (or
// Ring shard) a private RESP2 connection asks Redis for client-side caching
// invalidations in broadcast mode (CLIENT TRACKING ON REDIRECT <itself>
// BCAST PREFIX <the cache's prefix>) and listens on __redis__:invalidate.
// Redis then reports every write of a key under the prefix, by any client
// (this library, another program, redis-cli, an expiry or an eviction), so
// the key is dropped from memory in every process that holds it.
//
// A process is sure of its invalidations only while every such connection
// is subscribed; whenever one is lost, reconnects, or the set of masters
// changes, the whole near cache is dropped and memory is not served until
// the connections are back. Reads begun before a drop or an invalidation of
// their key are not stored (see ticket): the race between a read's reply and
// the invalidation of its key cannot leave an old value in memory.

package cache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/rediserr"
	"github.com/stampede-go/stampede/internal/token"
)

// invalidateChannel is where Redis sends RESP2 tracking invalidations.
const invalidateChannel = "__redis__:invalidate"

// coherenceStripes is how many invalidation counters the keys share: a read
// voided by an invalidation of another key of its stripe is only not stored.
const coherenceStripes = 4096

// coherenceCheck is how often a tracker pings its connections and, on a
// cluster or Ring, looks for a changed set of masters.
var coherenceCheck = time.Second

// tracker is the invalidation side of a near cache. It is safe for
// concurrent use.
type tracker struct {
	rdb    redis.UniversalClient
	prefix string
	seed   maphash.Seed
	onDrop func(key string, all bool) // removes key (or everything) from memory

	gens  [coherenceStripes]atomic.Uint64 // per stripe: invalidations seen
	epoch atomic.Uint64                   // every drop of everything
	ready atomic.Bool                     // every node is subscribed and nothing is in doubt

	mu     sync.Mutex       // protects nodes
	nodes  map[string]*node // by address
	nnodes atomic.Int32     // len(nodes)
	stop   context.CancelFunc
	done   sync.WaitGroup

	// Strict coherence (lease.go, confirm.go).
	id         string        // names this holder's lease and its acknowledgement channel
	leaseKey   string        // the prefix's lease registry
	markCh     string        // where writers' markers come (cluster, Ring; anywhere when asked again)
	nonceKey   string        // what writers' marker keys begin with (single server)
	ackCh      string        // where this writer's acknowledgements come
	lease      time.Duration // see WithNearLease
	leaseUntil atomic.Int64  // nanotime until which memory may be served
	renewNow   chan struct{} // the tracker became ready: renew at once
	pingGen    atomic.Uint64 // the last renewal's number, sent in its PINGs
	pongs      chan struct{} // a renewal's PONG came
	onLapse    func(holder string)
	onRefused  func(error) // Redis refused a command the near cache needs (see refuse)
	refused    atomic.Bool // that was reported, and no renewal succeeded since

	seq     atomic.Uint64 // this writer's writes
	pmu     sync.Mutex
	pending map[string]*confirmation // protected by pmu; by write number
	mmu     sync.Mutex
	marks   map[string]*markSeen // protected by mmu; markers seen on some connections only
	acks    chan string          // markers to acknowledge
}

// node is the tracking connection to one master or shard.
type node struct {
	addr    string
	client  *redis.Client
	sub     *redis.PubSub
	subbed  atomic.Bool   // its subscription is confirmed since the last loss
	id      atomic.Int64  // the connection's CLIENT ID, for operators and tests
	server  atomic.Value  // string: the run_id of the server the connection is on
	redial  atomic.Bool   // the connection is on the wrong server: start over on a new one
	pong    atomic.Uint64 // the last lease renewal this connection answered
	stopped chan struct{}
}

// ticket is taken before a read is sent; the read's reply may be kept in
// memory only if nothing was invalidated in between (see tracker.valid).
type ticket struct {
	epoch, gen uint64
	stripe     uint32
	ok         bool // the tracker was ready when the ticket was taken
}

func newTracker(rdb redis.UniversalClient, prefix string, leaseLen time.Duration, onDrop func(string, bool), onLapse func(string), onRefused func(error)) *tracker {
	ctx, cancel := context.WithCancel(context.Background())
	t := &tracker{
		rdb: rdb, prefix: prefix, seed: maphash.MakeSeed(), onDrop: onDrop, nodes: map[string]*node{}, stop: cancel,
		id: token.NewToken(), leaseKey: leaseKey(prefix), lease: leaseLen, onLapse: onLapse, onRefused: onRefused, markCh: markChannel(prefix), nonceKey: markKeyPrefix(prefix),
		renewNow: make(chan struct{}, 1), pongs: make(chan struct{}, 1),
		pending: map[string]*confirmation{}, marks: map[string]*markSeen{}, acks: make(chan string, 4096),
	}
	t.ackCh = ackChannel(prefix, t.id)
	t.done.Add(3)
	go t.watch(ctx)
	go t.renewLoop(ctx)
	go t.ackLoop(ctx)
	return t
}

// refuse reports err, once until a renewal succeeds, if it is Redis refusing
// a command the near cache needs (an ACL without it, a renamed command): the
// near cache then never serves, which nothing else would show. It returns
// err.
func (t *tracker) refuse(err error) error {
	if rediserr.Classify(err, false) == rediserr.Fatal && !t.refused.Swap(true) {
		t.onRefused(err)
	}
	return err
}

// channels are what every tracking connection subscribes: the markers and
// this writer's acknowledgements before the invalidations, so that both are
// confirmed when the tracker becomes sure.
func (t *tracker) channels() []string { return []string{t.markCh, t.ackCh, invalidateChannel} }

func (t *tracker) stripe(key string) uint32 {
	return uint32(maphash.String(t.seed, key) % coherenceStripes)
}

// take returns a ticket for a read of key about to be sent.
func (t *tracker) take(key string) ticket {
	s := t.stripe(key)
	tk := ticket{epoch: t.epoch.Load(), gen: t.gens[s].Load(), stripe: s}
	tk.ok = t.ready.Load()
	return tk
}

// valid reports whether a reply read under tk may be stored: the tracker was
// and is still sure, and neither key's stripe nor everything was invalidated
// since. Call it while holding no lock a drop needs (it takes none).
func (t *tracker) valid(tk ticket) bool {
	return tk.ok && t.ready.Load() && t.epoch.Load() == tk.epoch && t.gens[tk.stripe].Load() == tk.gen
}

// invalidate voids reads of key in flight and drops key from memory.
func (t *tracker) invalidate(key string) {
	t.gens[t.stripe(key)].Add(1)
	t.onDrop(key, false)
}

// dropAll voids every read in flight and empties memory; with lost, memory is
// not served until every node is subscribed again.
func (t *tracker) dropAll(lost bool) {
	if lost {
		t.ready.Store(false)
	}
	t.epoch.Add(1)
	t.onDrop("", true)
	t.ackAll() // nothing old is left in memory
}

// watch keeps a node per master (per shard on a Ring) until Close.
func (t *tracker) watch(ctx context.Context) {
	defer t.done.Done()
	tick := time.NewTicker(coherenceCheck)
	defer tick.Stop()
	for {
		t.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sync makes the tracked nodes the current masters; a change drops memory.
func (t *tracker) sync(ctx context.Context) {
	want, err := t.masters(ctx)
	if err != nil {
		if t.ready.Load() {
			t.dropAll(true)
		}
		return
	}
	t.mu.Lock()
	changed := len(want) != len(t.nodes)
	for addr := range want {
		if _, ok := t.nodes[addr]; !ok {
			changed = true
		}
	}
	t.mu.Unlock()
	if changed {
		// Before the count of connections changes: a marker counted against
		// the old set is then acknowledged with memory already empty.
		t.dropAll(true)
	}
	t.mu.Lock()
	for addr, opt := range want {
		if _, ok := t.nodes[addr]; !ok {
			t.nodes[addr] = t.startNode(ctx, addr, opt)
		}
	}
	for addr, n := range t.nodes {
		if _, ok := want[addr]; !ok {
			delete(t.nodes, addr)
			t.stopNode(n)
		}
	}
	t.nnodes.Store(int32(len(t.nodes)))
	t.mu.Unlock()
	if changed {
		t.dropAll(true)
	}
	t.settle()
}

// settle makes the tracker sure once every node is subscribed.
func (t *tracker) settle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := len(t.nodes) > 0
	for _, n := range t.nodes {
		all = all && n.subbed.Load()
	}
	if all && !t.ready.Load() {
		t.ready.Store(true)
		select { // serve only once the lease is renewed over these connections
		case t.renewNow <- struct{}{}:
		default:
		}
	}
}

// masters lists the nodes that hold the cache's keys, with their options.
func (t *tracker) masters(ctx context.Context) (map[string]*redis.Options, error) {
	out := map[string]*redis.Options{}
	var mu sync.Mutex
	add := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		out[c.Options().Addr] = c.Options()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, coherenceCheck)
	defer cancel()
	switch r := t.rdb.(type) {
	case *redis.ClusterClient:
		r.ReloadState(ctx) // in the background: the next check sees a new topology
		return out, r.ForEachMaster(ctx, add)
	case *redis.Ring:
		return out, r.ForEachShard(ctx, add)
	case *redis.Client:
		return out, add(ctx, r)
	}
	return nil, errors.New("cache: near cache: unsupported Redis client type")
}

// startNode opens the tracking connection to one node. Tracking is enabled
// on the connection itself, in its OnConnect, before go-redis (re)subscribes
// it: a reconnect therefore re-enables tracking before the subscription is
// confirmed, and the receive loop treats every loss as a drop of memory.
func (t *tracker) startNode(ctx context.Context, addr string, base *redis.Options) *node {
	// The connection settings only, field by field: a copy of the whole
	// struct would share pointers the user's client writes to (go-redis
	// v9.23's MaintNotificationsConfig, mutated when a server refuses the
	// handshake: a data race under -race on Redis 6.2).
	opt := redis.Options{
		Network: base.Network, Addr: base.Addr, Dialer: base.Dialer, TLSConfig: base.TLSConfig,
		Username: base.Username, Password: base.Password, CredentialsProvider: base.CredentialsProvider, DB: base.DB,
		MaxRetries: base.MaxRetries, MinRetryBackoff: base.MinRetryBackoff, MaxRetryBackoff: base.MaxRetryBackoff,
		DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
		ContextTimeoutEnabled: base.ContextTimeoutEnabled, PoolTimeout: base.PoolTimeout,
		Protocol:   2, // RESP2: invalidations arrive as messages on __redis__:invalidate
		PoolSize:   1,
		ClientName: "stampede-near",
	}
	userOnConnect := base.OnConnect
	prefix := t.prefix
	n := &node{addr: addr, stopped: make(chan struct{})}
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userOnConnect != nil {
			if err := userOnConnect(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return t.refuse(fmt.Errorf("CLIENT ID: %w", err))
		}
		args := []any{"CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST"}
		if prefix != "" {
			args = append(args, "PREFIX", prefix)
		}
		n.id.Store(id)
		cmd := redis.NewCmd(ctx, args...) // *redis.Conn has no Do before go-redis v9.6
		if err := cn.Process(ctx, cmd); err != nil {
			return t.refuse(fmt.Errorf("CLIENT TRACKING: %w", err))
		}
		// Which server this is: a lease renewal counts only if its script
		// ran on a server these connections track (lease.go).
		info, err := cn.Info(ctx, "server").Result()
		if err != nil {
			return t.refuse(fmt.Errorf("INFO: %w", err))
		}
		n.server.Store(runID(info))
		return nil
	}
	n.client = redis.NewClient(&opt)
	n.sub = n.client.Subscribe(ctx, t.channels()...)
	t.done.Add(1)
	go t.receive(ctx, n)
	return n
}

// stopNode closes n; t.mu must be held.
func (t *tracker) stopNode(n *node) {
	close(n.stopped)
	_ = n.sub.Close()
	_ = n.client.Close()
}

// receive applies one node's invalidations until the node is stopped. Any
// doubt (an error, a silent connection) drops memory; go-redis reconnects
// and resubscribes on the next receive, and the confirmation makes the
// node sure again.
func (t *tracker) receive(ctx context.Context, n *node) {
	defer t.done.Done()
	pinged := false
	for {
		msg, err := n.sub.ReceiveTimeout(ctx, coherenceCheck)
		select {
		case <-n.stopped:
			return
		default:
		}
		if ctx.Err() != nil {
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			pinged = false
			if m.Kind == "subscribe" && m.Channel == invalidateChannel {
				t.dropAll(true) // anything written while unsubscribed was missed
				n.subbed.Store(true)
				t.settle()
			}
			continue
		case *redis.Message:
			pinged = false
			switch m.Channel {
			case t.markCh:
				t.marked(n, m.Payload)
				continue
			case t.ackCh:
				t.acked(m.Payload)
				continue
			}
			var marks []string
			for _, k := range append(m.PayloadSlice, m.Payload) {
				switch {
				case k == "":
				case strings.HasPrefix(k, t.nonceKey):
					marks = append(marks, k[len(t.nonceKey):])
				default:
					t.invalidate(k)
				}
			}
			for _, mk := range marks { // after the keys they follow
				t.marked(n, mk)
			}
			continue
		case *redis.Pong:
			pinged = false
			if strings.HasPrefix(m.Payload, "lease:") {
				t.pong(n, m.Payload)
			}
			continue
		}
		var nerr net.Error
		switch {
		case errors.As(err, &nerr) && nerr.Timeout() && !pinged:
			pinged = true // quiet: make sure the connection still answers
			if n.sub.Ping(ctx) == nil {
				continue
			}
		case err != nil && strings.Contains(err.Error(), "unsupported pubsub message payload"):
			// A nil payload: Redis invalidated everything (FLUSHALL or
			// FLUSHDB). The connection is still subscribed.
			t.dropAll(false)
			continue
		}
		// Lost, or silent past a ping: in doubt until subscribed again.
		n.subbed.Store(false)
		t.dropAll(true)
		if redial := n.redial.Swap(false); pinged || redial {
			pinged = false
			_ = n.sub.Close() // a silent or misplaced connection: start over on a new one
			t.mu.Lock()
			if cur, ok := t.nodes[n.addr]; ok && cur == n {
				n.sub = n.client.Subscribe(ctx, t.channels()...)
			}
			t.mu.Unlock()
		}
		select { // do not spin on a node that refuses
		case <-time.After(100 * time.Millisecond):
		case <-n.stopped:
			return
		case <-ctx.Done():
			return
		}
	}
}

// close stops every node and waits for the goroutines.
func (t *tracker) close() {
	t.ready.Store(false) // nothing served from here on, before the lease is given back
	t.leaseUntil.Store(0)
	t.stop()
	t.mu.Lock()
	for _, n := range t.nodes {
		t.stopNode(n) // under mu: receive replaces n.sub under mu
	}
	t.nodes = map[string]*node{}
	t.mu.Unlock()
	t.done.Wait()
	t.resign()
}
