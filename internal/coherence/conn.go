// conn.go is one tracking connection: how it is opened and what its messages do.

package coherence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// node is the tracking connection to one master or shard.
type node struct {
	addr    string
	client  *redis.Client
	sub     *redis.PubSub // replaced by receive, under Tracker.mu
	subbed  atomic.Bool   // its subscription is confirmed since the last loss
	id      atomic.Int64  // the connection's CLIENT ID, for operators and tests
	server  atomic.Value  // string: the run_id of the server the connection is on
	redial  atomic.Bool   // the connection is on the wrong server: start over on a new one
	pong    atomic.Uint64 // the last lease renewal this connection answered
	stopped chan struct{}
}

// channels are what every tracking connection subscribes: the markers and
// this writer's acknowledgements before the invalidations, so that both are
// confirmed when the tracker becomes sure.
func (t *Tracker) channels() []string { return []string{t.markCh, t.ackCh, invalidateChannel} }

// startNode opens the tracking connection to one node. Tracking is enabled
// on the connection itself, in its OnConnect, before go-redis (re)subscribes
// it: a reconnect therefore re-enables tracking before the subscription is
// confirmed, and the receive loop treats every loss as a drop of memory.
func (t *Tracker) startNode(ctx context.Context, addr string, base *redis.Options) *node {
	n := &node{addr: addr, stopped: make(chan struct{})}
	opt := nodeOptions(base)
	opt.OnConnect = t.onConnect(n, base.OnConnect)
	n.client = redis.NewClient(&opt)
	n.sub = n.client.Subscribe(ctx, t.channels()...)
	t.done.Add(1)
	go t.receive(ctx, n)
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

// onConnect is n's OnConnect: the user's, then tracking on, then which
// server this is, since a lease renewal counts only if its script ran on a
// server the tracking connections are on (lease.go).
func (t *Tracker) onConnect(n *node, user func(context.Context, *redis.Conn) error) func(context.Context, *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		if user != nil {
			if err := user(ctx, cn); err != nil {
				return err
			}
		}
		_ = cn.ClientSetName(ctx, ClientName).Err() // for operators only: an ACL may refuse it
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return t.refuse(fmt.Errorf("CLIENT ID: %w", err))
		}
		args := []any{"CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST"}
		if t.prefix != "" {
			args = append(args, "PREFIX", t.prefix)
		}
		n.id.Store(id)
		cmd := redis.NewCmd(ctx, args...) // Process, which every supported go-redis has on a *redis.Conn
		if err := cn.Process(ctx, cmd); err != nil {
			return t.refuse(fmt.Errorf("CLIENT TRACKING: %w", err))
		}
		info, err := cn.Info(ctx, "server").Result()
		if err != nil {
			return t.refuse(fmt.Errorf("INFO: %w", err))
		}
		n.server.Store(runID(info))
		return nil
	}
}

// stopNode closes n; t.mu must be held.
func (t *Tracker) stopNode(n *node) {
	close(n.stopped)
	_ = n.sub.Close()
	_ = n.client.Close()
}

// receive applies one node's messages until the node is stopped. Any doubt
// (an error, a silent connection) drops memory; go-redis reconnects and
// resubscribes on the next receive, and the confirmation makes the node
// sure again.
func (t *Tracker) receive(ctx context.Context, n *node) {
	defer t.done.Done()
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
		if t.apply(n, msg) {
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
			t.dropAll(false)
			continue
		}
		t.lost(ctx, n, pinged)
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
// is not one (an error, a timeout).
func (t *Tracker) apply(n *node, msg any) bool {
	switch m := msg.(type) {
	case *redis.Subscription:
		if m.Kind == "subscribe" && m.Channel == invalidateChannel {
			t.dropAll(true) // anything written while unsubscribed was missed
			n.subbed.Store(true)
			t.settle()
		}
	case *redis.Message:
		switch m.Channel {
		case t.markCh:
			t.marked(n, m.Payload)
		case t.ackCh:
			t.acked(m.Payload)
		default:
			t.invalidated(n, append(m.PayloadSlice, m.Payload))
		}
	case *redis.Pong:
		if strings.HasPrefix(m.Payload, "lease:") {
			t.pong(n, m.Payload)
		}
	default:
		return false
	}
	return true
}

// invalidated applies a batch of invalidated keys received on n. The marker
// keys among them count after the keys they follow.
func (t *Tracker) invalidated(n *node, keys []string) {
	var marks []string
	for _, k := range keys {
		switch {
		case k == "":
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

// lost puts n in doubt until it is subscribed again, and drops memory. A
// connection that was silent past a ping (pinged), or is on the wrong
// server, starts over on a new one.
func (t *Tracker) lost(ctx context.Context, n *node, pinged bool) {
	n.subbed.Store(false)
	t.dropAll(true)
	if redial := n.redial.Swap(false); pinged || redial {
		_ = n.sub.Close()
		t.mu.Lock()
		if cur, ok := t.nodes[n.addr]; ok && cur == n {
			n.sub = n.client.Subscribe(ctx, t.channels()...)
		}
		t.mu.Unlock()
	}
}
