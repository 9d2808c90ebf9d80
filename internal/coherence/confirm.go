// This file is the writer's side: a write waits until every other holder acknowledged it or lost its lease.

package coherence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/confirm.lua
	confirmLua    string
	confirmScript = redis.NewScript(confirmLua)
)

// confirmation collects the acknowledgements of one write.
type confirmation struct {
	mu     sync.Mutex
	acked  map[string]bool // by holder id; protected by mu
	ch     chan struct{}   // a new acknowledgement came
	gen    uint64          // a writer without a near cache: its subscription's generation when the write began
	sureCh <-chan struct{} // a near cache's tracker not sure when the write began: closed once it is

	holdersAlone bool // announced to its keys' per-key holders alone, and so asked again (confirm_keys.lua)
}

// Write runs a write of keys under the tracker's prefix and announces it to
// the other processes' near caches: on a single server or a cluster to the
// per-key holders of keys and to every holder that tracks by prefix (see
// confirm_keys.lua), on a Ring to every holder. On a single server (a *redis.Client)
// pipe adds the write's commands to one pipeline with the announcement,
// whose marker is then a key that the confirmation script writes and
// deletes: Redis sends its invalidation with the write's own or after it,
// whichever event-loop turn ran them. Elsewhere direct runs the write and
// the marker is published once it returned: on a cluster through the bus to
// every master (a key of the written key's slot would follow the slot, not
// the master that sent the write's invalidation, if the slot moved in
// between), on a Ring on every shard.
//
// Write returns the write's error and wait, which waits until no near cache
// of another process can serve the old values: every holder of a running
// lease acknowledged the write, or its lease ended. Once the write is known
// done, drop the keys from this process's memory (the tracker does not wait
// for its own acknowledgement), then call wait. wait returns an error only
// when the confirmation could not be asked for (Redis failed) or ctx ended
// first; the write itself is done either way. A write that is retried
// instead need not call wait. A writer's tracker ([NewWriter]) waits the
// same way.
func (t *Tracker) Write(ctx context.Context, keys []string, pipe func(redis.Pipeliner), direct func() error) (wait func() error, err error) {
	if _, ok := t.rdb.(*redis.Client); ok {
		wait, err = t.writeInline(ctx, keys, pipe)
	} else {
		err = direct()
	}
	if wait == nil && t.keyed() {
		wait = func() error { return t.confirmKeys(ctx, keys) }
	}
	if wait == nil {
		wait = func() error { return t.confirm(ctx) }
	}
	return wait, err
}

// writeInline sends the commands write adds and the confirmation in one
// pipeline. It returns the write's error and, when the write succeeded,
// the wait for the acknowledgements (which must be called).
func (t *Tracker) writeInline(ctx context.Context, keys []string, write func(p redis.Pipeliner)) (wait func() error, err error) {
	seq, marker, cf := t.begin()
	var confirm *redis.Cmd
	var regs []string // (registries() spends a narrowed tracker's try of the registry: only when used)
	keyed := t.keyed()
	cmds, perr := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		write(p)
		if keyed {
			confirm = t.confirmKeysCmd(ctx, p, keys, marker, t.fleet(keys), true, nil, false)
		} else {
			regs = t.registries()
			confirm = confirmScript.EvalSha(ctx, p, append(regs, t.markKeys+marker), "", marker) // a NOSCRIPT confirms by the marker, below
		}
		return nil
	})
	recv := nanotime()
	if err := writeFailed(cmds, perr, confirm); err != nil {
		t.end(seq)
		return nil, err
	}
	return func() error {
		reply, err := confirm.Slice()
		switch {
		case err != nil && keyed: // NOSCRIPT, the marker key refused (maxmemory), a refusal: confirmed again, by a PUBLISH
			t.end(seq)
			return t.confirmKeys(ctx, keys)
		case err != nil: // the marker key could not be written (maxmemory, say): publish the marker instead
			t.narrowed(err, regs)
			t.end(seq)
			return t.confirm(ctx)
		case keyed:
			cf.holdersAlone = toHoldersAlone(reply)
			reply = leasesOf(reply)
		default:
			t.widened(regs)
		}
		defer t.end(seq)
		return t.await(ctx, cf, marker, reply, recv)
	}, nil
}

// writeFailed returns the error of a write pipelined with its confirmation
// (confirm, the last of cmds; perr, the pipeline's), or nil if it was done.
func writeFailed(cmds []redis.Cmder, perr error, confirm *redis.Cmd) error {
	for _, cmd := range cmds[:max(len(cmds)-1, 0)] {
		if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	if perr != nil && (len(cmds) == 0 || confirm.Err() == nil) {
		// The pipeline failed before any reply (go-redis may leave the
		// commands' errors unset then): nothing was written.
		return perr
	}
	return nil
}

// begin registers a write's confirmation before anything is sent (an
// acknowledgement may come before the confirmation's reply); end forgets it.
func (t *Tracker) begin() (seq, marker string, cf *confirmation) {
	seq = strconv.FormatUint(t.seq.Add(1), 10)
	cf = &confirmation{acked: map[string]bool{}, ch: make(chan struct{}, 1), gen: t.sub.gen.Load()}
	if !t.writerOnly {
		cf.sureCh = t.whenSure() // taken now: a tracker made sure before await still closes it
	}
	t.pmu.Lock()
	t.pending[seq] = cf
	t.pmu.Unlock()
	return seq, t.id + ":" + seq, cf
}

func (t *Tracker) end(seq string) {
	t.pmu.Lock()
	delete(t.pending, seq)
	t.pmu.Unlock()
}

// confirm announces a write that returned (publishing its marker) and waits
// for the acknowledgements.
func (t *Tracker) confirm(ctx context.Context) error {
	seq, marker, cf := t.begin()
	defer t.end(seq)
	channel := t.markCh
	if _, ok := t.rdb.(*redis.Ring); ok {
		if err := t.publishMarker(ctx, marker); err != nil {
			return err
		}
		channel = ""
	}
	reply, err := t.runLease(ctx, confirmScript, channel, marker)
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
func (t *Tracker) publishMarker(ctx context.Context, marker string) error {
	if ring, ok := t.rdb.(*redis.Ring); ok {
		return ring.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Publish(ctx, t.markCh, marker).Err()
		})
	}
	return t.rdb.Publish(ctx, t.markCh, marker).Err()
}

// await waits for the acknowledgements of the holders that the
// confirmation's reply (received at recv) lists, or their leases' ends,
// asking again for lost acknowledgements (see asker). A writer without a
// near cache listens for them from here on (see Tracker.listen), and asks
// again as soon as its subscription is confirmed if it was not when the
// write began.
func (t *Tracker) await(ctx context.Context, cf *confirmation, marker string, reply []any, recv int64) error {
	need, graceUntil, err := t.deadlines(reply, recv)
	if err != nil {
		return err
	}
	ask := &asker{t: t, marker: marker, next: recv + int64(t.lease/4)}
	if cf.holdersAlone {
		ask.holders = slices.Collect(maps.Keys(need))
	}
	var heard <-chan struct{} // closed when acknowledgements sent before may have been lost
	switch {
	case len(need) == 0:
	case t.writerOnly:
		heard = t.listen(cf.gen)
		defer t.unlisten()
	case cf.sureCh != nil:
		// The write began before this tracker's acknowledgement channel was
		// confirmed (a Cache just made): ask again as soon as it is, not
		// a quarter lease later.
		heard = cf.sureCh
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := nanotime()
		next, waiting := t.outstanding(cf, need, now)
		if graceUntil > now && (next == 0 || graceUntil < next) {
			next = graceUntil
		}
		next = ask.step(ctx, now, next, waiting)
		if next == 0 {
			return nil
		}
		timer.Reset(time.Duration(next - now))
		select {
		case <-cf.ch:
		case <-heard:
			heard = nil
			if t.writerOnly {
				heard = t.relisten()
			}
			go ask.publish(ctx)
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// deadlines turns the confirmation's reply (received at recv) into local
// deadlines: for each other holder with a running lease, when to stop
// waiting for its acknowledgement; and, for a registry created within a
// lease, when the leases it may have forgotten have surely ended (0: none).
func (t *Tracker) deadlines(reply []any, recv int64) (need map[string]int64, graceUntil int64, err error) {
	now, since, leases, err := parseLeases(reply)
	if err != nil {
		return nil, 0, err
	}
	// Server milliseconds still to run from the reply's arrival (which is
	// after the server read its clock), stretched by the drift allowed
	// between the clocks.
	stretch := func(ms int64) int64 {
		return recv + int64(float64(time.Duration(ms)*time.Millisecond)*(1+leaseDrift)) + int64(leaseMargin)
	}
	if left := since + t.lease.Milliseconds() - now; left > 0 {
		graceUntil = stretch(left) // leases a lost registry forgot may still run
	}
	need = map[string]int64{}
	for id, end := range leases {
		if id != t.id && end > now { // this process dropped its own copies before asking
			need[id] = stretch(end - now)
		}
	}
	return need, graceUntil, nil
}

// outstanding removes from need the holders that acknowledged and those
// whose deadline passed (reported through OnLapse), and returns the
// earliest deadline left (0: none) and whether any holder is left.
func (t *Tracker) outstanding(cf *confirmation, need map[string]int64, now int64) (next int64, waiting bool) {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	for id, until := range need {
		switch {
		case cf.acked[id]:
			delete(need, id)
		case now >= until:
			delete(need, id)
			t.hooks.OnLapse(id)
		case next == 0 || until < next:
			next = until
		}
	}
	return next, len(need) > 0
}

// asker publishes a write's marker again while acknowledgements are
// missing: every quarter lease (the writer's: every process of a prefix
// should use the same), at most maxAsks times, one ask at a time and off
// the waiting goroutine, so that a hung Redis never holds the wait past the
// leases; an ask that fails ends the asking.
type asker struct {
	t              *Tracker
	marker         string
	holders        []string // non-nil: asked on these per-key holders' own channels, not the prefix's
	next           int64    // nanotime of the next ask
	asks           int
	asking, failed atomic.Bool
}

const maxAsks = 2

// step asks again if it is time and some holder is still awaited, and
// returns the wait's next wake-up: next, or the next ask if earlier.
func (a *asker) step(ctx context.Context, now, next int64, waiting bool) int64 {
	if a.failed.Load() {
		a.asks = maxAsks
	}
	if waiting && a.asks < maxAsks && now >= a.next {
		a.next = now + int64(a.t.lease/4)
		if !a.asking.Swap(true) {
			a.asks++
			go a.ask(ctx)
		}
	}
	if waiting && a.asks < maxAsks && a.next < next {
		next = a.next
	}
	return next
}

// ask publishes the marker once, within a quarter lease.
func (a *asker) ask(ctx context.Context) {
	defer a.asking.Store(false)
	a.publish(ctx)
}

// publish publishes the marker, within a quarter lease; a failure ends the
// asking.
func (a *asker) publish(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, a.t.lease/4)
	defer cancel()
	publish := func() error { return a.t.publishMarker(ctx, a.marker) }
	if a.holders != nil {
		publish = func() error { return a.t.publishToHolders(ctx, a.marker, a.holders) }
	}
	if publish() != nil {
		a.failed.Store(true)
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
		leases[id] = max(leases[id], end) // listed in both registries
	}
	return now, since, leases, nil
}

// acked records an acknowledgement ("<holder>:<seq>[,<seq>...]", one
// message for every write of this writer the holder saw together) heard on
// this tracker's acknowledgement channel, which its own tracking
// connections subscribe (a writer's tracker: its acknowledgement
// subscription, see NewWriter): a holder's PUBLISH reaches it on a single
// server, through the bus on a cluster, and on the channel's shard on a
// Ring.
func (t *Tracker) acked(payload string) {
	holder, seqs, ok := strings.Cut(payload, ":")
	if !ok {
		return
	}
	for seq := range strings.SplitSeq(seqs, ",") {
		t.pmu.Lock()
		cf := t.pending[seq]
		t.pmu.Unlock()
		if cf == nil {
			continue // a write that already returned (its holder's lease ran out first)
		}
		cf.mu.Lock()
		cf.acked[holder] = true
		cf.mu.Unlock()
		select {
		case cf.ch <- struct{}{}:
		default:
		}
	}
}
