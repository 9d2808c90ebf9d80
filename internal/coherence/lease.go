// This file renews this process's coherence lease: the holder's side of strict coherence.

package coherence

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/lease.lua
	leaseLua    string
	leaseScript = redis.NewScript(leaseLua)
)

// Clock margins. leaseDrift is the clock-rate error allowed between a
// holder, the Redis server and a writer (1%, as Redlock's drift factor),
// and leaseMargin a fixed allowance for the millisecond rounding of the
// server's time.
const (
	leaseDrift  = 0.01
	leaseMargin = 2 * time.Millisecond
)

// renewLoop renews the lease every lease/4, and at once when the tracker
// becomes ready (t.renewNow), until ctx ends.
func (t *Tracker) renewLoop(ctx context.Context) {
	defer t.done.Done()
	defer close(t.renewDone)
	tick := time.NewTicker(t.lease / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-t.renewNow:
		}
		if t.ready.Load() {
			t.renew(ctx)
		}
		t.forgetMarks()
		t.forgetRegistrations()
	}
}

// trackedConn is a node and its subscription as a renewal found them (read
// under mu: receive replaces a silent node's subscription).
type trackedConn struct {
	n   *node
	sub *redis.PubSub
}

// renew runs one renewal; a failure leaves the lease to lapse.
//
// A renewal, every lease/4:
//  1. t0 = now (local monotonic clock);
//  2. a script on the prefix's registry writes this holder's lease end, the
//     server's TIME plus the lease;
//  3. a PING on every tracking connection: its PONG comes after every
//     invalidation queued on that connection before the PING, and the PING
//     left after step 2 was done;
//  4. once every PONG is in, memory may be served until t0 + lease, less the
//     clock-rate margin (the lease counts from before the server's TIME),
//     if the script ran on a server one of these connections is on (its
//     run_id, see tracks).
//
// A writer that read the registry after its write (Tracker.Write) finds every
// holder that renewed before that read; a renewal after it pings after the
// write, so its PONG follows the write's invalidation. Either way a holder
// cannot serve the old value past what the writer waits for.
func (t *Tracker) renew(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, t.lease/2)
	defer cancel()
	t0 := nanotime()
	perKey := "0"
	if t.holdCh != "" {
		perKey = "1"
	}
	reply, err := t.runLease(ctx, leaseScript, t.id, t.lease.Milliseconds(), perKey)
	if err != nil || len(reply) != 2 {
		if err != nil {
			t.refuse(fmt.Errorf("the lease script: %w", err))
		}
		return
	}
	server, _ := reply[1].(string)
	conns := t.hub.conns()
	if !t.tracks(conns, server) { // no need to wait for PONGs from the wrong server
		return
	}
	if !t.hub.pingAll(ctx, conns) {
		return
	}
	if !t.tracks(conns, server) { // a connection that reconnected meanwhile may be elsewhere
		return
	}
	t.refused.Store(false) // a later refusal is reported again
	t.extend(t0 + int64(float64(t.lease)*(1-leaseDrift)) - int64(leaseMargin))
}

// conns lists the nodes and their current subscriptions.
func (h *Hub) conns() []trackedConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	conns := make([]trackedConn, 0, len(h.nodes))
	for _, n := range h.nodes {
		conns = append(conns, trackedConn{n, n.sub})
	}
	return conns
}

// pingAll sends a renewal's PING on every connection and reports whether
// all were subscribed, all PINGs were sent, and their PONGs came before
// ctx ended: then every invalidation sent before the PINGs has arrived.
func (h *Hub) pingAll(ctx context.Context, conns []trackedConn) bool {
	return h.pingEach(ctx, conns, true)
}

// pingEach sends a lease PING on each subscribed connection of conns and
// waits for those PONGs until ctx ends. It reports whether every PING was
// sent and answered (and, with all, whether every connection was
// subscribed): a PING that could not be sent proves nothing. Each
// connection numbers its PINGs as it sends them, so that a later number's
// PONG answers an earlier PING too, whichever tracker sent it.
func (h *Hub) pingEach(ctx context.Context, conns []trackedConn, all bool) bool {
	want := make([]uint64, len(conns)) // 0: nothing to wait for
	sent := true
	for i, c := range conns {
		if !c.n.subbed.Load() {
			if all {
				return false
			}
			continue
		}
		if !c.n.ping(ctx, c.sub, &want[i]) {
			if all {
				return false
			}
			want[i], sent = 0, false // its PONG will not come
		}
	}
	for {
		h.pmu.Lock()
		pongs := h.pongs
		h.pmu.Unlock()
		in := true
		for i, c := range conns {
			in = in && c.n.pong.Load() >= want[i]
		}
		if in {
			return sent
		}
		select {
		case <-pongs:
		case <-ctx.Done():
			return false
		}
	}
}

// ping sends a lease PING on sub, numbered in n's order, into gen.
func (n *node) ping(ctx context.Context, sub *redis.PubSub, gen *uint64) bool {
	n.pingMu.Lock()
	defer n.pingMu.Unlock()
	n.pingSeq++
	*gen = n.pingSeq
	return sub.Ping(ctx, "lease:"+strconv.FormatUint(*gen, 10)) == nil
}

// extend moves the lease's end to until, unless it is already later.
func (t *Tracker) extend(until int64) {
	for {
		cur := t.leaseUntil.Load()
		if until <= cur || t.leaseUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// tracks reports whether one of conns, still the node's subscription, is on
// the server (a run_id) where the renewal's script ran. If none is, the
// client reaches another server than the tracking connections do (a
// Sentinel failover moved the client, not yet the subscriber): the
// invalidations of what the client reads would not arrive, so memory is
// dropped and, for a single-server client, the tracking connections start
// over through the client's dialer, which finds the client's server. (On a
// cluster or Ring, sync finds changed masters by address.)
func (t *Tracker) tracks(conns []trackedConn, server string) bool {
	h := t.hub
	h.mu.Lock()
	for _, c := range conns {
		if s, _ := c.n.server.Load().(string); s != "" && s == server && c.n.subbed.Load() && c.n.sub == c.sub {
			h.mu.Unlock()
			return true
		}
	}
	if _, ok := t.rdb.(*redis.Client); ok {
		for _, c := range conns {
			if c.n.sub == c.sub { // not one its receive loop replaced already
				c.n.redial.Store(true)
				_ = c.sub.Close() // the receive loop subscribes again, on a new connection
			}
		}
	}
	h.mu.Unlock()
	t.dropAll(true)
	return false
}

// runID reads the run_id line of INFO server.
func runID(info string) string {
	_, rest, ok := strings.Cut(info, "run_id:")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "\r\n")
	return strings.TrimSpace(id)
}

// pong records a lease PONG from n (payload "lease:<gen>") and wakes the
// renewals waiting for one.
func (h *Hub) pong(n *node, payload string) {
	gen, err := strconv.ParseUint(payload[len("lease:"):], 10, 64)
	if err != nil {
		return
	}
	if gen > n.pong.Load() {
		n.pong.Store(gen) // only n's receive loop stores it
	}
	h.pmu.Lock()
	close(h.pongs)
	h.pongs = make(chan struct{})
	h.pmu.Unlock()
}

// resign removes this holder from the registry at Close, so that writers
// do not wait for a process that no longer serves memory; then, with a
// PING on every tracking connection, it takes in the markers of the writes
// that read the registry before, so that they are acknowledged, not waited
// out (on a single server: a cluster's markers come through the bus, in no
// order with the PINGs, so some may come after). Every connection still
// subscribed is pinged, whatever the others. Bounded by a quarter lease.
func (t *Tracker) resign() {
	ctx, cancel := context.WithTimeout(context.Background(), t.lease/4)
	defer cancel()
	keys := t.inUse() // a refused try of the registry would skip the PINGs
	for _, k := range t.leaseKeys(leaseScript, keys)[1:] {
		if k != keys[0] {
			_ = t.rdb.HDel(ctx, k, t.id).Err() // where writers of earlier versions look, if it is there
		}
	}
	if t.rdb.HDel(ctx, keys[0], t.id).Err() == nil {
		t.hub.pingEach(ctx, t.hub.conns(), false)
	}
}
