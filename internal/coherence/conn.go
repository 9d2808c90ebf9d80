// This file is one tracking connection: how it is opened and what its messages do.

package coherence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// node is the tracking connection to one master or shard, shared by the
// trackers of a hub.
type node struct {
	addr      string
	client    *redis.Client
	sub       *redis.PubSub   // replaced by receive, under Hub.mu
	subbed    atomic.Bool     // its invalidations' subscription is confirmed since the last loss
	confirmed map[string]bool // the channels confirmed since the last loss; protected by Hub.mu
	tracked   atomic.Pointer[[]string]
	id        atomic.Int64  // the connection's CLIENT ID, for operators and tests
	server    atomic.Value  // string: the run_id of the server the connection is on
	redial    atomic.Bool   // the connection is on the wrong server: start over on a new one
	restart   atomic.Bool   // a prefix it does not track was added: start over at once
	pingMu    sync.Mutex    // orders lease PINGs as their numbers: protects pingSeq
	pingSeq   uint64        // the last lease PING sent
	pong      atomic.Uint64 // the last lease PING answered
	stopped   chan struct{}
	base      *redis.Options         // the node's options, as the user's client has them
	reader    atomic.Pointer[reader] // per-key reads: tracked, redirected to this connection
}

// trackedPrefixes are the prefixes the current connection tracks (nil: none
// yet).
func (n *node) trackedPrefixes() []string {
	if p := n.tracked.Load(); p != nil {
		return *p
	}
	return nil
}

// serves reports whether n delivers everything t needs: its invalidations
// and its channels, confirmed since the last loss. Hub.mu is held.
func (n *node) serves(t *Tracker) bool {
	if !n.subbed.Load() || !n.confirmed[t.markCh] || !n.confirmed[t.ackCh] || t.holdCh != "" && !n.confirmed[t.holdCh] || !t.coveredBy(n.trackedPrefixes()) {
		return false
	}
	r := n.reader.Load()
	return !t.perKey || r != nil && r.sub == n.id.Load()
}

// ownChannels are what t needs subscribed on every connection: the markers
// of its prefix, its own acknowledgements, and a per-key holder's own
// markers.
func (t *Tracker) ownChannels() []string {
	if t.holdCh != "" {
		return []string{t.markCh, t.ackCh, t.holdCh}
	}
	return []string{t.markCh, t.ackCh}
}

// startNode opens the tracking connection to one node. Tracking is enabled
// on the connection itself, in its OnConnect, before go-redis (re)subscribes
// it: a reconnect therefore re-enables tracking before the subscription is
// confirmed, and the receive loop treats every loss as a drop of memory.
// h.mu is held.
func (h *Hub) startNode(ctx context.Context, addr string, base *redis.Options) *node {
	n := &node{addr: addr, stopped: make(chan struct{}), confirmed: map[string]bool{}, base: base}
	opt := nodeOptions(base)
	opt.OnConnect = h.onConnect(n, base.OnConnect)
	n.client = redis.NewClient(&opt)
	n.sub = n.client.Subscribe(ctx, h.state.Load().channels...)
	h.done.Add(1)
	go h.receive(ctx, n)
	return n
}

// ClientName names the tracking connections in CLIENT LIST.
const ClientName = "stampede-near"

// nodeOptions are the options of a tracking connection to the node of base.
// It copies the connection settings field by field: a copy of the whole
// struct would share pointers that the user's client writes to while it
// runs, a data race.
func nodeOptions(base *redis.Options) redis.Options {
	return redis.Options{
		Network: base.Network, Addr: base.Addr, Dialer: base.Dialer, TLSConfig: base.TLSConfig,
		Username: base.Username, Password: base.Password, CredentialsProvider: base.CredentialsProvider, DB: base.DB,
		MaxRetries: base.MaxRetries, MinRetryBackoff: base.MinRetryBackoff, MaxRetryBackoff: base.MaxRetryBackoff,
		DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
		ContextTimeoutEnabled: base.ContextTimeoutEnabled, PoolTimeout: base.PoolTimeout,
		Protocol: 2, // RESP2: invalidations arrive as messages on __redis__:invalidate
		PoolSize: 1,
		// No ClientName: go-redis would fail the connection if an ACL
		// refuses CLIENT SETNAME; onConnect names it when it may.
	}
}

// onConnect is n's OnConnect: the user's, then tracking on for the hub's
// prefixes, then which server this is, since a lease renewal counts only if
// its script ran on a server the tracking connections are on (see the lease scripts).
// It takes no lock: it runs wherever go-redis dials, register included.
func (h *Hub) onConnect(n *node, user func(context.Context, *redis.Conn) error) func(context.Context, *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		// Named first, for operators and for the client's own OnConnect,
		// which may tell the tracking connection apart; an ACL may refuse it.
		_ = cn.ClientSetName(ctx, ClientName).Err()
		if user != nil {
			if err := user(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return h.refuse(fmt.Errorf("CLIENT ID: %w", err))
		}
		n.id.Store(id)
		prefixes := h.state.Load().prefixes
		if len(prefixes) > 0 { // none: no tracker yet, nothing to hear
			args := []any{"CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST"}
			for _, p := range prefixes {
				if p != "" { // the empty prefix is every key: BCAST alone
					args = append(args, "PREFIX", p)
				}
			}
			cmd := redis.NewCmd(ctx, args...) // Process, which every supported go-redis has on a *redis.Conn
			if err := cn.Process(ctx, cmd); err != nil {
				return h.refuse(fmt.Errorf("CLIENT TRACKING: %w", err))
			}
		}
		n.tracked.Store(&prefixes)
		info, err := cn.Info(ctx, "server").Result()
		if err != nil {
			return h.refuse(fmt.Errorf("INFO: %w", err))
		}
		n.server.Store(runID(info))
		return nil
	}
}

// stopNode closes n; Hub.mu must be held.
func (h *Hub) stopNode(n *node) {
	h.stopReader(n)
	close(n.stopped)
	_ = n.sub.Close()
	_ = n.client.Close()
}

// restart makes n start over on a new connection, which tracks the hub's
// prefixes as they are then; Hub.mu is held.
func restart(n *node) {
	n.restart.Store(true)
	_ = n.sub.Close() // the receive loop subscribes again
}

// receive applies one node's messages until the node is stopped. Any doubt
// (an error, a silent connection) drops memory; go-redis reconnects and
// resubscribes on the next receive, and the confirmation makes the node
// sure again.
func (h *Hub) receive(ctx context.Context, n *node) {
	defer h.done.Done()
	pinged := false
	var backoff redialBackoff
	for {
		msg, err := n.sub.ReceiveTimeout(ctx, checkEvery)
		select {
		case <-n.stopped:
			return
		default:
		}
		if ctx.Err() != nil {
			return
		}
		h.tmu.RLock()
		applied := h.apply(n, msg)
		h.tmu.RUnlock()
		if applied {
			pinged = false
			backoff.reset()
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
			h.dropAll(false)
			continue
		}
		if h.lost(ctx, n, pinged) {
			continue // started over for a new prefix: nothing failed
		}
		pinged = false
		select { // do not spin on a node that is down or refuses
		case <-time.After(backoff.next()):
		case <-n.stopped:
			return
		case <-ctx.Done():
			return
		}
	}
}

// The pause of a tracking connection before it tries again after a
// failure: a dead Redis costs a dial every redialMax, not ten a second,
// and a Redis back costs at most redialMax more of reads not served from
// memory.
const (
	redialMin = 100 * time.Millisecond
	redialMax = 2 * time.Second
)

// redialBackoff is the pause before the next try: redialMin doubling up
// to redialMax, drawn in its upper half so that processes cut off together
// do not redial together. Owned by one receive loop.
type redialBackoff struct{ d time.Duration }

func (b *redialBackoff) next() time.Duration {
	b.d = min(max(2*b.d, redialMin), redialMax)
	return b.d/2 + rand.N(b.d/2+1)
}

// reset starts over: the connection works.
func (b *redialBackoff) reset() { b.d = 0 }

// apply handles a message received on n; it reports false for anything that
// is not one (an error, a timeout). Hub.tmu is held for reading.
func (h *Hub) apply(n *node, msg any) bool {
	switch m := msg.(type) {
	case *redis.Subscription:
		h.confirm(n, m)
	case *redis.Message:
		if m.Channel == invalidateChannel {
			keys := append(m.PayloadSlice, m.Payload)
			for _, t := range h.trackers {
				t.invalidated(n, keys)
			}
			return true
		}
		for _, t := range h.byChan[m.Channel] {
			if m.Channel == t.markCh || m.Channel == t.holdCh {
				t.marked(n, m.Payload)
			} else {
				t.acked(m.Payload)
			}
		}
	case *redis.Pong:
		if strings.HasPrefix(m.Payload, "lease:") {
			h.pong(n, m.Payload)
		}
	default:
		return false
	}
	return true
}

// confirm records a (un)subscription's confirmation on n; the invalidations'
// drops every tracker's memory, since anything written while n was not
// subscribed was missed. Hub.tmu is held for reading.
func (h *Hub) confirm(n *node, m *redis.Subscription) {
	if m.Kind == "subscribe" && m.Channel == invalidateChannel {
		if h.hasPerKey() {
			h.bindReader(n, n.base) // before the void: a read after it goes through the new reader
		}
		h.dropAllLocked(true)
		n.subbed.Store(true)
	}
	h.mu.Lock()
	if cur := h.nodes[n.addr]; cur == n {
		n.confirmed[m.Channel] = m.Kind == "subscribe"
	}
	h.mu.Unlock()
	h.settle()
}

// invalidated applies a batch of invalidated keys received on n: those under
// t's prefix. The marker keys among them count after the keys they follow.
func (t *Tracker) invalidated(n *node, keys []string) {
	var marks []string
	for _, k := range keys {
		switch {
		case k == "" || !strings.HasPrefix(k, t.prefix):
		case strings.HasPrefix(k, t.markKeys):
			marks = append(marks, k[len(t.markKeys):])
		default:
			t.Invalidate(k)
		}
	}
	for _, mk := range marks {
		t.marked(n, mk)
	}
}

// lost puts n in doubt until it is subscribed again, and drops every
// tracker's memory. A connection that was silent past a ping (pinged), is
// on the wrong server, or must track a new prefix starts over on a new one.
// It reports whether it started over for a new prefix.
func (h *Hub) lost(ctx context.Context, n *node, pinged bool) (restarted bool) {
	h.mu.Lock()
	n.subbed.Store(false)
	clear(n.confirmed)
	h.mu.Unlock()
	h.dropAll(true)
	redial := n.redial.Swap(false)
	restarted = n.restart.Swap(false)
	if pinged || redial || restarted {
		_ = n.sub.Close()
		h.mu.Lock()
		if cur, ok := h.nodes[n.addr]; ok && cur == n {
			n.sub = n.client.Subscribe(ctx, h.state.Load().channels...)
		}
		h.mu.Unlock()
	}
	return restarted
}
