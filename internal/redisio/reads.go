// This file sends the reads of concurrent callers together: under load a
// read costs Redis a share of one MGET instead of a GET and a system call of
// its own.
//
// There is no timer (rueidis pipe.go's "flush when free"): a read that finds
// nothing on the wire goes out at once, as a plain GET on the caller's
// goroutine; reads that arrive while a read or a batch is on the wire queue
// up and go out together as soon as it returns, at most maxBatch at a time.
// A debounce would tax every read at low concurrency (go-redis
// autopipeline.go says why); here a lone caller pays one mutex.
//
// A *redis.Client sends one MGET per batch. A *redis.ClusterClient sends one
// MGET per hash slot, those of one master in one pipeline through that
// master's own client, whatever the client's ReadOnly or RouteRandomly
// routing, unless replica reads were asked for. A master's client follows
// no redirect: a slot's MOVED, ASK or TRYAGAIN is that slot's readers'
// transient error, which the cache answers with a script sent through the
// cluster client. A failover cluster client is a *redis.ClusterClient and
// is read the same way. A redis.Ring and any other client get one plain GET
// per read, through the client's own routing.
//
// Built on plain MGET and Pipeline rather than go-redis's AutoPipeline:
// that needs a newer go-redis than this module requires, sends one GET per
// key where an MGET carries a whole batch, and follows the client's replica
// routing.
//
// The promises: a read joins only a batch formed after it was queued, so
// after its caller began (a Delete that returned before is seen); a waiting
// reader leaves when its ctx ends while the batch goes on for the others, on
// a context of its own; each read gets its own reply or error; one slot's
// error reaches only that slot's readers.

package redisio

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/internal/rediserr"
	"github.com/stampede-go/stampede/internal/slot"
)

// maxBatch bounds the reads of one batch, so that one MGET's reply does not
// hold the others up for long.
const maxBatch = 256

// coalescer is safe for concurrent use.
type coalescer struct {
	rdb          redis.UniversalClient
	server       *redis.Client                     // non-nil: rdb is one server's client; a batch is one MGET
	masters      *redis.ClusterClient              // non-nil: reads go to the cluster's masters, an MGET per slot
	batchContext func() context.Context            // a batch's own context: no caller's ctx may end it
	via          func(*redis.Client) *redis.Client // see Client.TrackReads; nil: none
	pool         sync.Pool                         // *pendingRead whose reader took its reply

	mu    sync.Mutex     // protects queue and busy
	queue []*pendingRead // reads waiting for the next batch
	busy  bool           // a read or batch is on the wire; its sender sends the queue after it
	batch []*pendingRead // the batch being sent; only the sender (busy) uses it
}

// pendingRead is a queued read and, once done fires, its reply.
type pendingRead struct {
	key     string
	extra   []string // keys read with it, in the same MGET (single server only)
	val     []byte
	vals    []any // extra's replies
	tracked bool  // sent through a tracked reader (see Client.TrackReads)
	err     error
	done    chan struct{} // buffered: the sender never waits for a reader that left
}

// get is Client.Read; with detached, Client.ReadDetached.
// extra, the keys read with key, is for a single server only.
func (co *coalescer) get(ctx context.Context, key string, extra []string, detached bool) Reply {
	if co.server == nil && co.masters == nil {
		b, err := co.rdb.Get(ctx, key).Bytes()
		return Reply{Val: b, Err: err}
	}
	co.mu.Lock()
	start := false // the queue's sender: a batch of one, on a goroutine of its own
	switch {
	case !co.busy && !detached: // nothing on the wire: go at once
		co.busy = true
		co.mu.Unlock()
		rep := co.single(ctx, key, extra)
		co.done()
		return rep
	case !co.busy:
		co.busy, start = true, true
	}
	r, _ := co.pool.Get().(*pendingRead)
	if r == nil {
		r = &pendingRead{done: make(chan struct{}, 1)}
	}
	r.key, r.extra = key, extra
	co.queue = append(co.queue, r)
	co.mu.Unlock()
	if start {
		go co.drain()
	}
	select {
	case <-r.done:
		rep := Reply{Val: r.val, Extra: r.vals, Tracked: r.tracked && r.err == nil, Err: r.err}
		r.key, r.extra, r.val, r.vals, r.tracked, r.err = "", nil, nil, nil, false, nil
		co.pool.Put(r)
		return rep
	case <-ctx.Done():
		return Reply{Err: ctx.Err()} // the batch still fills r, into its buffer; r is never reused
	}
}

// route returns the client that a read meant for node goes through: its
// tracked reader if there is one (tracked), else node.
func (co *coalescer) route(node *redis.Client) (*redis.Client, bool) {
	if co.via != nil {
		if r := co.via(node); r != nil {
			return r, true
		}
	}
	return node, false
}

// sendVia fills reads, meant for node, through node's tracked reader if it
// has one (see throughReader), and notes whether it did.
func (co *coalescer) sendVia(node *redis.Client, reads []*pendingRead, send func(*redis.Client)) {
	if co.via == nil { // no near cache tracks per key: nothing to route
		send(node)
		return
	}
	tracked := throughReader(node, co.route, send,
		func() bool { return anyReaderFailed(reads) },
		func() {
			for _, r := range reads {
				r.val, r.vals, r.err = nil, nil, nil
			}
		})
	for _, r := range reads {
		r.tracked = tracked
	}
}

// throughReader sends through node's tracked reader if route gives one,
// and through node itself if it gives none or the reader failed (failed,
// see readerFailed; reset clears what the failed send left): a reader
// that cannot connect must not fail reads that node can serve. It reports
// whether the reader served them.
func throughReader(node *redis.Client, route func(*redis.Client) (*redis.Client, bool), send func(*redis.Client), failed func() bool, reset func()) bool {
	if rdr, ok := route(node); ok {
		send(rdr)
		if !failed() {
			return true
		}
		reset()
	}
	send(node)
	return false
}

// anyReaderFailed reports whether a read failed through a reader (see
// readerFailed).
func anyReaderFailed(reads []*pendingRead) bool {
	for _, r := range reads {
		if readerFailed(r.err) {
			return true
		}
	}
	return false
}

// readerFailed reports whether a read through a reader failed: on the wire
// (a dial, a closed connection, a timeout) or with a reply that the user's
// client would have retried (LOADING, TRYAGAIN: the reader retries
// nothing). The read is then sent again through the user's client.
func readerFailed(err error) bool {
	return err != nil && err != redis.Nil
}

// single is a lone read, on the caller's ctx.
func (co *coalescer) single(ctx context.Context, key string, extra []string) Reply {
	rdb := co.server
	if rdb == nil {
		var err error
		if rdb, err = co.masters.MasterForKey(ctx, key); err != nil {
			return Reply{Err: err}
		}
	}
	if rdr, ok := co.route(rdb); ok {
		rep := readOne(ctx, rdr, key, extra)
		if !readerFailed(rep.Err) {
			rep.Tracked = rep.Err == nil
			return rep
		}
	}
	return readOne(ctx, rdb, key, extra)
}

// readOne reads key (and extra, in one MGET) from c.
func readOne(ctx context.Context, c *redis.Client, key string, extra []string) Reply {
	if len(extra) > 0 {
		r := &pendingRead{key: key, extra: extra}
		mget(ctx, c, []*pendingRead{r})
		return Reply{Val: r.val, Extra: r.vals, Err: r.err}
	}
	b, err := c.Get(ctx, key).Bytes()
	if rediserr.IsWrongType(err) { // as MGET says of it
		err = redis.Nil
	}
	return Reply{Val: b, Err: err}
}

// done is called by the sender when its read or batch returned: the reads
// queued meanwhile go out next, on a goroutine that ends when the queue is
// empty, so that the sender's own caller need not wait for them.
func (co *coalescer) done() {
	co.mu.Lock()
	defer co.mu.Unlock()
	if len(co.queue) == 0 {
		co.busy = false
		return
	}
	go co.drain()
}

// drain sends the queue, a batch at a time, until it is empty.
func (co *coalescer) drain() {
	for {
		co.mu.Lock()
		n := min(len(co.queue), maxBatch)
		if n == 0 {
			co.busy = false
			co.mu.Unlock()
			return
		}
		batch := append(co.batch[:0], co.queue[:n]...)
		rest := copy(co.queue, co.queue[n:])
		clear(co.queue[rest:])
		co.queue = co.queue[:rest]
		co.mu.Unlock()

		ctx := co.batchContext()
		if co.server != nil {
			co.sendVia(co.server, batch, func(c *redis.Client) { mget(ctx, c, batch) })
		} else {
			co.perMaster(ctx, batch)
		}
		for _, r := range batch {
			r.done <- struct{}{}
		}
		clear(batch)
		co.batch = batch[:0]
	}
}

// perMaster fills reads on a cluster: an MGET per slot, those of one master
// in one pipeline, the masters' pipelines concurrently.
func (co *coalescer) perMaster(ctx context.Context, reads []*pendingRead) {
	slots := bySlot(reads)
	firstKeys := make([]string, len(slots))
	for i, rs := range slots {
		firstKeys[i] = rs[0].key
	}
	to, found := toMasters(ctx, co.masters, firstKeys, func(i int, err error) { failReads(slots[i], err) })
	sendPerNode(found, to, func(node *redis.Client, idx []int) {
		nodeSlots := make([][]*pendingRead, len(idx))
		var reads []*pendingRead
		for j, i := range idx {
			nodeSlots[j] = slots[i]
			reads = append(reads, slots[i]...)
		}
		co.sendVia(node, reads, func(c *redis.Client) { pipeMGets(ctx, c, nodeSlots) })
	})
}

// bySlot groups reads by their key's hash slot.
func bySlot(reads []*pendingRead) [][]*pendingRead {
	index := map[uint16]int{} // slot -> its group in slots
	var slots [][]*pendingRead
	for _, r := range reads {
		s := slot.Of(r.key)
		i, ok := index[s]
		if !ok {
			i = len(slots)
			index[s] = i
			slots = append(slots, nil)
		}
		slots[i] = append(slots[i], r)
	}
	return slots
}

// pipeMGets sends one MGET per slot to node, in one pipeline when there are
// several.
func pipeMGets(ctx context.Context, node *redis.Client, slots [][]*pendingRead) {
	if len(slots) == 1 {
		mget(ctx, node, slots[0])
		return
	}
	cmds := make([]*redis.SliceCmd, len(slots))
	ats := make([]map[string]int, len(slots))
	_, perr := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, rs := range slots {
			var keys []string
			keys, ats[i] = readKeys(rs)
			cmds[i] = p.MGet(ctx, keys...)
		}
		return nil
	})
	for i, cmd := range cmds {
		if cmd.Err() == nil && cmd.Val() == nil && perr != nil {
			cmd.SetErr(perr) // a pipeline that could not be sent may leave its commands untouched
		}
		fillFromMGet(slots[i], ats[i], cmd)
	}
}

// mget fills reads from one MGET of their keys.
func mget(ctx context.Context, c redis.Cmdable, reads []*pendingRead) {
	keys, at := readKeys(reads)
	fillFromMGet(reads, at, c.MGet(ctx, keys...))
}

// fillFromMGet gives each read its value from an MGET of the keys
// readKeys(reads) returned with at, or the MGET's error.
func fillFromMGet(reads []*pendingRead, at map[string]int, cmd *redis.SliceCmd) {
	vals, err := cmd.Result()
	if err == nil && len(vals) != len(at) {
		err = errors.New("cache: redis: MGET replied with the wrong number of values")
	}
	if err != nil {
		failReads(reads, err)
		return
	}
	n := 0
	for _, r := range reads {
		n += len(r.extra)
	}
	extra := make([]any, n) // every read's vals, carved from one slice
	for _, r := range reads {
		switch v := vals[at[r.key]].(type) {
		case string:
			r.val = []byte(v)
		default: // nil: no value, or one of another type
			r.err = redis.Nil
		}
		r.vals, extra = extra[:len(r.extra):len(r.extra)], extra[len(r.extra):]
		for j, k := range r.extra {
			r.vals[j] = vals[at[k]]
		}
	}
}

// failReads gives every read err.
func failReads(reads []*pendingRead, err error) {
	for _, r := range reads {
		r.err = err
	}
}

// readKeys lists the keys of reads and their extra keys, each once, and
// where each is in the list: reads of a hot key, and tagged reads sharing
// version keys, cost Redis one key each per MGET rather than one per read.
func readKeys(reads []*pendingRead) (keys []string, at map[string]int) {
	at = make(map[string]int, len(reads))
	add := func(k string) {
		if _, ok := at[k]; !ok {
			at[k] = len(keys)
			keys = append(keys, k)
		}
	}
	for _, r := range reads {
		add(r.key)
		for _, k := range r.extra {
			add(k)
		}
	}
	return keys, at
}
