// confirm.go is the writer's side of strict coherence: Delete and Set return
// only once every near cache that may hold the old value has dropped it, or
// its lease (lease.go) has run out. After its write, a writer runs one
// script on the prefix's lease registry that publishes a marker (its id and
// the write's number) on the marker channel and lists the holders and their
// lease ends. Every holder's tracking connections are subscribed to the
// marker channel, and a marker published after the write reached Redis
// arrives after the write's invalidation on every connection: a holder that
// has seen the marker on all of them has dropped the old value, and says so
// on the writer's acknowledgement channel. The writer waits for the
// acknowledgement of every holder whose lease runs, each at most until its
// lease ends by the server's clock; a frozen process costs a write at most
// one lease, never an error. An acknowledgement lost on the way (published
// before the writer's own subscription was confirmed, or across a
// reconnect) is asked for again: the marker is published again, after the
// write like the first, every quarter lease, at most twice. A writer hears
// its acknowledgements on its own tracking connections, subscribed to its
// acknowledgement channel too (a holder's PUBLISH reaches it on a single
// server, through the cluster bus on a cluster, and on the channel's shard
// on a Ring).

package cache

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/slot"
)

var (
	//go:embed scripts/confirm.lua
	confirmLua    string
	confirmScript = redis.NewScript(confirmLua)
)

// markChannel carries the writers' markers to every holder of a prefix;
// ackChannel carries a holder's acknowledgements to one writer. Both under
// the prefix, so that an ACL channel pattern granting the prefix grants them.
func markChannel(prefix string) string { return prefix + "stampede:near:mark" }

// markKeyPrefix begins the marker keys of a single server (see inline): a
// reserved shape, under the prefix so that tracking reports it.
func markKeyPrefix(prefix string) string { return slot.Companion(prefix, ":stampede:mark:") }

func ackChannel(prefix, id string) string {
	return prefix + "stampede:near:ack:" + id
}

// confirmation collects the acknowledgements of one write.
type confirmation struct {
	mu    sync.Mutex
	acked map[string]bool // by holder id
	ch    chan struct{}   // a new acknowledgement came
}

// begin registers a write's confirmation before anything is sent (an
// acknowledgement may come before the confirmation's reply); end forgets it.
func (t *tracker) begin() (seq, marker string, cf *confirmation) {
	seq = strconv.FormatUint(t.seq.Add(1), 10)
	cf = &confirmation{acked: map[string]bool{}, ch: make(chan struct{}, 1)}
	t.pmu.Lock()
	t.pending[seq] = cf
	t.pmu.Unlock()
	return seq, t.id + ":" + seq, cf
}

func (t *tracker) end(seq string) {
	t.pmu.Lock()
	delete(t.pending, seq)
	t.pmu.Unlock()
}

// inline reports whether a write and its confirmation go out in one round
// trip: on a single server (a *redis.Client) the marker is a key that the
// confirmation script writes and deletes, whose invalidation Redis sends
// with the write's own or after it, whichever event-loop turn ran them. On
// a cluster the marker is published after the write returned, through the
// bus to every master (a key of the written key's slot would follow the
// slot, not the master that sent the write's invalidation, if the slot
// moved in between); on a Ring, on every shard.
func (t *tracker) inline() bool {
	_, ok := t.rdb.(*redis.Client)
	return ok
}

// writeInline sends the commands write adds and the confirmation in one
// pipeline. It returns the write's error and, when the write succeeded,
// the wait for the acknowledgements (which must be called).
func (t *tracker) writeInline(ctx context.Context, write func(p redis.Pipeliner)) (wait func() error, err error) {
	seq, marker, cf := t.begin()
	var confirm *redis.Cmd
	cmds, perr := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		write(p)
		confirm = p.Eval(ctx, confirmLua, []string{t.leaseKey, t.nonceKey + marker}, "", marker)
		return nil
	})
	recv := nanotime()
	for _, cmd := range cmds[:max(len(cmds)-1, 0)] {
		if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
			t.end(seq)
			return nil, err
		}
	}
	if perr != nil && (len(cmds) == 0 || confirm.Err() == nil) {
		// The pipeline failed before any reply (older go-redis leaves the
		// commands' errors unset then): nothing was written.
		t.end(seq)
		return nil, perr
	}
	return func() error {
		reply, err := confirm.Slice()
		if err != nil { // the marker key could not be written (maxmemory, say): publish the marker instead
			t.end(seq)
			return t.confirm(ctx)
		}
		defer t.end(seq)
		return t.await(ctx, cf, marker, reply, recv)
	}, nil
}

// confirm waits, after a write returned, until no near cache of another
// process can serve the old values: every holder of a running lease
// acknowledged the write, or its lease ended. It returns an error only when
// the confirmation could not be asked for (Redis failed) or ctx ended first;
// the write itself is done either way.
func (t *tracker) confirm(ctx context.Context) error {
	seq, marker, cf := t.begin()
	defer t.end(seq)
	channel := markChannel(t.prefix)
	if _, ok := t.rdb.(*redis.Ring); ok {
		if err := t.publishMarker(ctx, marker); err != nil {
			return err
		}
		channel = ""
	}
	reply, err := confirmScript.Run(ctx, t.rdb, []string{t.leaseKey}, channel, marker).Slice()
	recv := nanotime()
	if err != nil {
		return err
	}
	return t.await(ctx, cf, marker, reply, recv)
}

// publishMarker publishes marker to every holder's tracking connections:
// through the bus of a cluster, on each shard of a Ring (no bus), on the one
// server otherwise. Called after the write returned, it follows the write's
// invalidations on every connection.
func (t *tracker) publishMarker(ctx context.Context, marker string) error {
	channel := markChannel(t.prefix)
	if ring, ok := t.rdb.(*redis.Ring); ok {
		return ring.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Publish(ctx, channel, marker).Err()
		})
	}
	return t.rdb.Publish(ctx, channel, marker).Err()
}

// await waits for the acknowledgements of the holders that the
// confirmation's reply (received at recv) lists, or their leases' ends. An
// acknowledgement can be lost (this writer's subscription not confirmed yet,
// a reconnect on either side): every quarter lease without all of them, the
// marker is published again, and holders acknowledge it again.
func (t *tracker) await(ctx context.Context, cf *confirmation, marker string, reply []any, recv int64) error {
	now, since, leases, err := parseLeases(reply)
	if err != nil {
		return err
	}
	// Local deadlines: server milliseconds still to run from the reply's
	// arrival (which is after the server read its clock), stretched by the
	// drift allowed between the clocks.
	stretch := func(ms int64) int64 {
		return recv + int64(float64(time.Duration(ms)*time.Millisecond)*(1+leaseDrift)) + int64(leaseMargin)
	}
	graceUntil := int64(0)
	if left := since + t.lease.Milliseconds() - now; left > 0 {
		graceUntil = stretch(left) // leases a lost registry forgot may still run
	}
	need := map[string]int64{}
	for id, end := range leases {
		if id != t.id && end > now { // this process dropped its own copies before asking
			need[id] = stretch(end - now)
		}
	}
	// Asking again: every quarter lease (the writer's: every process of a
	// prefix should use the same), at most twice, one ask at a time and off
	// this goroutine, so that a hung Redis never holds the wait past the
	// leases; an ask that fails ends the asking.
	const maxAsks = 2
	askAgain, asks := recv+int64(t.lease/4), 0
	var asking, askFailed atomic.Bool
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now, next := nanotime(), int64(0)
		if graceUntil > now {
			next = graceUntil
		}
		cf.mu.Lock()
		for id, until := range need {
			switch {
			case cf.acked[id]:
				delete(need, id)
			case now >= until:
				delete(need, id)
				t.onLapse(id)
			case next == 0 || until < next:
				next = until
			}
		}
		waiting := len(need) > 0
		cf.mu.Unlock()
		if askFailed.Load() {
			asks = maxAsks
		}
		if waiting && asks < maxAsks && now >= askAgain {
			askAgain = now + int64(t.lease/4)
			if !asking.Swap(true) {
				asks++
				go func() {
					defer asking.Store(false)
					actx, cancel := context.WithTimeout(ctx, t.lease/4)
					defer cancel()
					if t.publishMarker(actx, marker) != nil {
						askFailed.Store(true)
					}
				}()
			}
		}
		if waiting && asks < maxAsks && askAgain < next {
			next = askAgain
		}
		if next == 0 {
			return nil
		}
		timer.Reset(time.Duration(next - now))
		select {
		case <-cf.ch:
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// parseLeases reads confirm.lua's reply: the server's time, the registry's
// creation, and each holder's lease end.
func parseLeases(reply []any) (now, since int64, leases map[string]int64, err error) {
	bad := func() error { return fmt.Errorf("cache: near cache: unexpected confirmation reply %v", reply) }
	if len(reply) < 2 || len(reply)%2 != 0 {
		return 0, 0, nil, bad()
	}
	now, ok1 := reply[0].(int64)
	since, ok2 := reply[1].(int64)
	if !ok1 || !ok2 {
		return 0, 0, nil, bad()
	}
	leases = make(map[string]int64, len(reply)/2-1)
	for i := 2; i < len(reply); i += 2 {
		id, ok1 := reply[i].(string)
		end, ok2 := reply[i+1].(int64)
		if !ok1 || !ok2 {
			return 0, 0, nil, bad()
		}
		leases[id] = end
	}
	return now, since, leases, nil
}

// acked records an acknowledgement ("<holder>:<seq>") heard on this
// tracker's acknowledgement channel.
func (t *tracker) acked(payload string) {
	holder, seq, ok := strings.Cut(payload, ":")
	if !ok {
		return
	}
	t.pmu.Lock()
	cf := t.pending[seq]
	t.pmu.Unlock()
	if cf == nil {
		return // a write that already returned (its holder's lease ran out first)
	}
	cf.mu.Lock()
	cf.acked[holder] = true
	cf.mu.Unlock()
	select {
	case cf.ch <- struct{}{}:
	default:
	}
}

// markSeen is a marker seen on some of the tracking connections.
type markSeen struct {
	on map[*node]bool // the connections it came on: a marker published twice (a retried script) must not count twice
	at int64          // nanotime it first came
}

// marked handles a writer's marker ("<writer>:<seq>") received on n: once it
// has come on every connection, each of them has delivered the write's
// invalidation, and the write is acknowledged.
func (t *tracker) marked(n *node, marker string) {
	writer, _, ok := strings.Cut(marker, ":")
	if !ok || writer == t.id {
		return // this process's own write dropped its copies before asking
	}
	t.mmu.Lock()
	m := t.marks[marker]
	if m == nil {
		m = &markSeen{on: map[*node]bool{}, at: nanotime()}
		t.marks[marker] = m
	}
	m.on[n] = true
	if len(m.on) < int(t.nnodes.Load()) {
		t.mmu.Unlock()
		return
	}
	delete(t.marks, marker)
	t.mmu.Unlock()
	t.sendAck(marker)
}

// ackAll acknowledges every marker seen on some connections only: memory was
// just emptied, so no old value is left to drop.
func (t *tracker) ackAll() {
	t.mmu.Lock()
	marks := t.marks
	t.marks = map[string]*markSeen{}
	t.mmu.Unlock()
	for m := range marks {
		t.sendAck(m)
	}
}

// forgetMarks drops markers first seen over two leases ago that never came
// on every connection (a publish that failed on some shard): their writers
// stopped waiting a lease after writing.
func (t *tracker) forgetMarks() {
	old := nanotime() - 2*int64(t.lease)
	t.mmu.Lock()
	defer t.mmu.Unlock()
	for k, m := range t.marks {
		if m.at < old {
			delete(t.marks, k)
		}
	}
}

// sendAck queues an acknowledgement; a full queue drops it (the writer then
// waits for this holder's lease: slower, never wrong).
func (t *tracker) sendAck(marker string) {
	select {
	case t.acks <- marker:
	default:
	}
}

// ackLoop publishes the queued acknowledgements, those queued together in
// one pipeline, until ctx ends.
func (t *tracker) ackLoop(ctx context.Context) {
	defer t.done.Done()
	for {
		var batch []string
		select {
		case <-ctx.Done():
			return
		case m := <-t.acks:
			batch = append(batch, m)
		}
	drain:
		for len(batch) < 256 {
			select {
			case m := <-t.acks:
				batch = append(batch, m)
			default:
				break drain
			}
		}
		pctx, cancel := context.WithTimeout(ctx, t.lease)
		_, _ = t.rdb.Pipelined(pctx, func(p redis.Pipeliner) error {
			for _, m := range batch {
				writer, seq, _ := strings.Cut(m, ":")
				p.Publish(pctx, ackChannel(t.prefix, writer), t.id+":"+seq)
			}
			return nil
		})
		cancel()
	}
}
