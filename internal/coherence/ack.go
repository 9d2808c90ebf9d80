// This file is the holder's side of a write: acknowledge it once its marker came on every connection.

package coherence

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// markSeen is a marker seen on some of the tracking connections.
type markSeen struct {
	on map[*node]bool // the connections it came on: a marker published twice (a retried script) must not count twice
	at int64          // nanotime it first came
}

// marked handles a writer's marker ("<writer>:<seq>") received on n: once it
// has come on every connection, each of them has delivered the write's
// invalidation, and the write is acknowledged.
func (t *Tracker) marked(n *node, marker string) {
	writer, _, ok := strings.Cut(marker, ":")
	if !ok || writer == t.id || t.eventual {
		return // this process's own write dropped its copies before asking; no writer waits for an eventual one
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
func (t *Tracker) ackAll() {
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
func (t *Tracker) forgetMarks() {
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
func (t *Tracker) sendAck(marker string) {
	select {
	case t.acks <- marker:
	default:
	}
}

// ackLoop publishes the queued acknowledgements until ctx ends: those
// queued together in one pipeline, one message per writer that covers all
// of its markers among them, so that writes in flight together cost a
// holder one message per writer, not one per write. Each pipeline gets a
// quarter lease, even past ctx's end (Close: writers wait for it); at
// Close what is still queued gets one more quarter lease in all.
func (t *Tracker) ackLoop(ctx context.Context) {
	defer t.done.Done()
	for {
		var batch []string
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.lease/4)
			defer cancel()
			for batch = t.queuedAcks(nil); len(batch) > 0 && dctx.Err() == nil; batch = t.queuedAcks(nil) {
				t.publishAcks(dctx, batch)
			}
			return
		case m := <-t.acks:
			batch = append(batch, m)
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.lease/4)
		t.publishAcks(pctx, t.queuedAcks(batch))
		cancel()
	}
}

// queuedAcks appends to batch the acknowledgements queued, up to 256.
func (t *Tracker) queuedAcks(batch []string) []string {
	for len(batch) < 256 {
		select {
		case m := <-t.acks:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// publishAcks publishes batch in one pipeline.
func (t *Tracker) publishAcks(ctx context.Context, batch []string) {
	_, _ = t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for writer, seqs := range ackMessages(batch) {
			p.Publish(ctx, ackChannel(t.prefix, writer), t.id+":"+seqs)
		}
		return nil
	})
}

// ackMessages groups markers ("<writer>:<seq>") by writer: for each, the
// acknowledgement's sequence numbers, comma-separated.
func ackMessages(markers []string) map[string]string {
	out := make(map[string]string, 1)
	for _, m := range markers {
		writer, seq, _ := strings.Cut(m, ":")
		if prev, ok := out[writer]; ok {
			seq = prev + "," + seq
		}
		out[writer] = seq
	}
	return out
}
