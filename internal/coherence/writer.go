// This file is a writer without a near cache: it holds no lease and keeps no memory, yet confirms its writes like any other.

package coherence

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ackLinger is how long, in leases, a writer's acknowledgement
// subscription stays open after the last write that waited on it: writes
// closer together find it subscribed and are acknowledged in one hop; a
// later one subscribes again and asks again for what it may have missed.
const ackLinger = 10

// ackPoll bounds each receive on the acknowledgement subscription: the
// receiving goroutines end within it once no write waits.
const ackPoll = 100 * time.Millisecond

// ackSub is the acknowledgement subscription of a writer without a near
// cache (the tracking connections of a near cache subscribe the channel
// themselves). It is opened by the first write that has holders to wait
// for, stays open while writes come and closes ackLinger leases after the
// last one, or at Close; goroutines receive on it only while a write
// waits. On a Ring it is one subscription per shard, as the tracking
// connections are: a holder's PUBLISH in a pipeline goes to any shard
// (go-redis routes it as a keyless command).
type ackSub struct {
	ctx context.Context // ended by Close
	gen atomic.Uint64   // confirmations of the whole subscription so far; written under mu

	mu      sync.Mutex    // protects the fields below and each ackConn's
	conns   []*ackConn    // nil: not open
	synced  int64         // nanotime the Ring's shards were last listed
	subbed  bool          // every conn is confirmed and nothing was lost since
	heard   chan struct{} // closed at the next confirmation of every conn
	waiters int           // writes waiting for acknowledgements
	used    int64         // nanotime when the last wait ended
	idle    *time.Timer   // closes the conns once unused for ackLinger leases
	closed  bool          // Close was called
}

// ackConn is the subscription on one server (one shard of a Ring).
type ackConn struct {
	addr      string
	client    redis.UniversalClient // where it subscribes: the writer's client, or a Ring's shard
	ps        *redis.PubSub         // nil: not subscribed yet, or to subscribe again
	subbed    bool                  // ps's subscription is confirmed and nothing was lost since
	receiving bool                  // a goroutine receives on it
	gone      bool                  // closed: its shard left the Ring, or the subscription closed
}

// NewWriter returns the tracker of a process that writes keys under prefix
// on rdb (a *redis.Client, *redis.ClusterClient or *redis.Ring) without a
// near cache. Its writes ([Tracker.Write]) wait for the near caches of the
// other processes exactly as a near cache's own do, assuming they hold
// leases of leaseLen; it holds no lease (no writer waits for it), keeps no
// memory and serves nothing. It starts nothing: a write that finds holders
// to wait for subscribes to their acknowledgements. Only hooks.OnLapse is
// used. Close ends the subscription.
func NewWriter(rdb redis.UniversalClient, prefix string, leaseLen time.Duration, hooks Hooks) *Tracker {
	t, ctx := newTracker(rdb, prefix, leaseLen, hooks)
	t.writerOnly = true
	t.sub.ctx = ctx
	t.sub.heard = make(chan struct{})
	return t
}

// closedCh is a channel that is closed.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// listen makes sure that a write begun at the subscription's generation gen
// hears its acknowledgements until unlisten: the subscription is opened if
// it is not, and a goroutine receives on each of its connections. It
// returns a channel closed once the subscription is confirmed after gen:
// the write's marker must then be published again, since acknowledgements
// sent before may have been lost. nil after Close.
func (t *Tracker) listen(gen uint64) <-chan struct{} {
	s := &t.sub
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiters++
	if s.closed {
		return nil
	}
	t.syncAcks()
	for _, c := range s.conns {
		if !c.receiving {
			c.receiving = true
			t.done.Add(1)
			go t.receiveAcks(c)
		}
	}
	if s.subbed && s.gen.Load() != gen {
		return closedCh
	}
	return s.heard
}

// relisten returns the channel closed at the subscription's next
// confirmation (after a loss), or nil after Close.
func (t *Tracker) relisten() <-chan struct{} {
	s := &t.sub
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return s.heard
}

// unlisten ends what listen began.
func (t *Tracker) unlisten() {
	s := &t.sub
	s.mu.Lock()
	s.waiters--
	s.used = nanotime()
	s.mu.Unlock()
}

// syncAcks opens the subscription's connections, one for the writer's
// client (which routes the subscription as the holders' PUBLISH: the one
// server, or any node of a cluster, whose bus carries every message), or
// one per shard of a Ring, whose shards are listed again every checkEvery.
// t.sub.mu is held.
func (t *Tracker) syncAcks() {
	s := &t.sub
	ring, isRing := t.rdb.(*redis.Ring)
	if s.conns != nil && (!isRing || nanotime()-s.synced < int64(checkEvery)) {
		return
	}
	if s.conns == nil {
		s.used = nanotime()
		if s.idle == nil {
			s.idle = time.AfterFunc(ackLinger*t.lease, t.idleCheck)
		} else {
			s.idle.Reset(ackLinger * t.lease)
		}
	}
	if !isRing {
		s.conns = []*ackConn{{client: t.rdb}}
		return
	}
	s.synced = nanotime()
	want := map[string]*redis.Client{}
	var mu sync.Mutex
	_ = ring.ForEachShard(s.ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		want[c.Options().Addr] = c
		return nil
	})
	conns := make([]*ackConn, 0, len(want))
	for _, c := range s.conns {
		if _, ok := want[c.addr]; ok {
			delete(want, c.addr)
			conns = append(conns, c)
		} else {
			closeAck(c)
		}
	}
	for addr, c := range want {
		conns = append(conns, &ackConn{addr: addr, client: c})
		s.subbed = false // a new connection: acknowledgements sent to its shard were not heard
	}
	s.conns = conns
}

// closeAck closes c's subscription for good; t.sub.mu is held.
func closeAck(c *ackConn) {
	c.gone, c.subbed = true, false
	if c.ps != nil {
		_ = c.ps.Close()
		c.ps = nil
	}
}

// receiveAcks receives acknowledgements on c while some write waits for
// them, subscribing when c is not subscribed. A silent connection (no
// reply to a PING) is replaced; go-redis reconnects and subscribes again
// after an error. Every new confirmation lets the waiting writes ask again.
func (t *Tracker) receiveAcks(c *ackConn) {
	defer t.done.Done()
	s := &t.sub
	heardAt, pinged := nanotime(), false
	for {
		s.mu.Lock()
		if s.closed || s.waiters == 0 || c.gone {
			c.receiving = false
			s.mu.Unlock()
			return
		}
		ps := c.ps
		s.mu.Unlock()
		if ps == nil {
			t.openAck(c)
			heardAt, pinged = nanotime(), false
			continue
		}
		msg, err := ps.ReceiveTimeout(s.ctx, ackPoll)
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				t.subscribed(c, ps)
			}
		case *redis.Message:
			if m.Channel == t.ackCh {
				t.acked(m.Payload)
			}
		case *redis.Pong:
		default:
			var nerr net.Error
			quiet := time.Duration(nanotime() - heardAt)
			switch {
			case s.ctx.Err() != nil:
			case !errors.As(err, &nerr) || !nerr.Timeout():
				t.lostAcks(c, ps, false) // go-redis subscribes again on the next receive
				t.pause()
			case quiet < t.lease/4:
			case !pinged:
				pinged = true // quiet: make sure the connection still answers
				if ps.Ping(s.ctx) != nil {
					t.lostAcks(c, ps, false)
				}
			case quiet >= t.lease/2:
				t.lostAcks(c, ps, true) // no PONG: start over on a new connection
			}
			continue
		}
		heardAt, pinged = nanotime(), false
	}
}

// openAck subscribes c to the writer's acknowledgement channel (go-redis
// dials at once, and again on the next receive if that failed).
func (t *Tracker) openAck(c *ackConn) {
	ctx, cancel := context.WithTimeout(t.sub.ctx, t.lease)
	ps := c.client.Subscribe(ctx, t.ackCh)
	cancel()
	s := &t.sub
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || c.gone {
		_ = ps.Close()
		return
	}
	c.ps, c.subbed = ps, false
}

// pause waits a little before trying a connection that failed again, or
// until Close.
func (t *Tracker) pause() {
	select {
	case <-time.After(100 * time.Millisecond):
	case <-t.sub.ctx.Done():
	}
}

// subscribed records a confirmation of c's subscription ps; once every
// connection is confirmed, the subscription is.
func (t *Tracker) subscribed(c *ackConn, ps *redis.PubSub) {
	s := &t.sub
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.ps != ps || c.gone {
		return
	}
	c.subbed = true
	if s.subbed {
		return
	}
	for _, o := range s.conns {
		if !o.subbed {
			return
		}
	}
	s.subbed = true
	s.gen.Add(1)
	close(s.heard)
	s.heard = make(chan struct{})
}

// lostAcks records that c's subscription ps may have lost
// acknowledgements; with replace, ps is closed and the next receive
// subscribes anew.
func (t *Tracker) lostAcks(c *ackConn, ps *redis.PubSub, replace bool) {
	s := &t.sub
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.ps != ps {
		return
	}
	c.subbed, s.subbed = false, false
	if replace {
		_ = ps.Close()
		c.ps = nil
	}
}

// idleCheck closes the subscription once no write has waited on it for
// ackLinger leases.
func (t *Tracker) idleCheck() {
	s := &t.sub
	linger := ackLinger * t.lease
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.conns == nil {
		return
	}
	busy := s.waiters > 0
	for _, c := range s.conns {
		busy = busy || c.receiving
	}
	switch left := time.Duration(s.used + int64(linger) - nanotime()); {
	case busy:
		s.idle.Reset(linger)
	case left > 0:
		s.idle.Reset(left)
	default:
		for _, c := range s.conns {
			closeAck(c)
		}
		s.conns, s.subbed = nil, false
	}
}

// closeWriter is Close for a writer's tracker: the subscription is closed
// and the receiving goroutines ended.
func (t *Tracker) closeWriter() {
	s := &t.sub
	s.mu.Lock()
	s.closed = true
	if s.idle != nil {
		s.idle.Stop()
	}
	for _, c := range s.conns {
		closeAck(c)
	}
	s.conns, s.subbed = nil, false
	s.mu.Unlock()
	t.stop()
	t.done.Wait()
}
