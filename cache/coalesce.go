// coalesce.go sends the reads of concurrent flights together: under load a
// hit costs Redis a share of one MGET instead of a GET and a system call of
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
// master's node client (ClusterClient.MasterForKey): never
// ClusterClient.Pipelined, which races in go-redis while a slot migrates
// (RELIABILITY.md), and never a replica, whatever the client's ReadOnly or
// RouteRandomly routing, since a replica may still hold a value that Delete
// removed (unless WithReplicaReads asks for that). A node client follows
// no redirect: a slot's MOVED, ASK or TRYAGAIN is that slot's readers'
// transient error, which fetch turns into its read-or-lock script, sent
// through the cluster client. A failover
// cluster client (NewFailoverClusterClient) is a *redis.ClusterClient and is
// read from its master the same way. A redis.Ring and any other client get
// one plain GET per read, through the client's own routing.
//
// Built on plain MGET and Pipeline, not go-redis's AutoPipeline: it needs
// go-redis v9.22+ where this module's floor is v9.5.5; it sends one GET per
// key where an MGET does one per batch; it would follow the client's
// replica routing; and measured (BenchmarkHitConcurrent, BENCHMARKS.md,
// provisional, loaded machine, medians of 3) raw GETs through it cost 2.1x
// a raw GET at 1 goroutine (a debounce tax) and 4.0 us of Redis CPU per hit
// at 64 goroutines against this MGET path's 2.7 us per hit including the
// cache's work, with no win to pay for the floor.
//
// The promises hold: a read joins only a batch formed after it was queued,
// so after its flight began (read-after-Delete); a waiting flight leaves
// when its ctx ends while the batch goes on for the others, on a deadline of
// its own; each read gets its own reply or error, which fetch classifies as
// before (breaker, failure policy); one slot's error reaches only that
// slot's readers.

package cache

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/slot"
)

// maxBatch bounds the reads of one batch, so that one MGET's reply does not
// hold the others up for long.
const maxBatch = 256

// coalescer is safe for concurrent use.
type coalescer struct {
	rdb      redis.UniversalClient
	client   *redis.Client          // non-nil: a batch is one MGET
	cluster  *redis.ClusterClient   // non-nil: reads go to masters, an MGET per slot
	deadline func() context.Context // a batch's own deadline: no caller's ctx may end it
	pool     sync.Pool              // *pendingRead whose waiter took its reply

	mu    sync.Mutex     // protects queue and busy
	queue []*pendingRead // reads waiting for the next batch
	busy  bool           // a read or batch is on the wire; its sender sends the queue after it
	batch []*pendingRead // the batch being sent; only the sender (busy) uses it
}

// pendingRead is a queued read and, once done fires, its reply.
type pendingRead struct {
	key  string
	val  []byte
	err  error
	done chan struct{} // buffered: the sender never waits for a reader that left
}

// newCoalescer reads through rdb; deadline gives each batch its context.
// replicas leaves a cluster client's reads to its own routing
// (WithReplicaReads): one GET per read.
func newCoalescer(rdb redis.UniversalClient, deadline func() context.Context, replicas bool) *coalescer {
	co := &coalescer{rdb: rdb, deadline: deadline}
	switch r := rdb.(type) {
	case *redis.Client:
		co.client = r
	case *redis.ClusterClient:
		if !replicas {
			co.cluster = r
		}
	}
	return co
}

// get reads key: the bytes, redis.Nil when there are none (or a value of
// another type), or the read's error; ctx.Err() when ctx ends first.
func (co *coalescer) get(ctx context.Context, key string) ([]byte, error) {
	if co.client == nil && co.cluster == nil {
		return co.rdb.Get(ctx, key).Bytes()
	}
	co.mu.Lock()
	if !co.busy { // nothing on the wire: go at once
		co.busy = true
		co.mu.Unlock()
		b, err := co.single(ctx, key)
		co.done()
		return b, err
	}
	r, _ := co.pool.Get().(*pendingRead)
	if r == nil {
		r = &pendingRead{done: make(chan struct{}, 1)}
	}
	r.key = key
	co.queue = append(co.queue, r)
	co.mu.Unlock()
	select {
	case <-r.done:
		b, err := r.val, r.err
		r.key, r.val, r.err = "", nil, nil
		co.pool.Put(r)
		return b, err
	case <-ctx.Done():
		return nil, ctx.Err() // the batch still answers r, into its buffer; r is never reused
	}
}

// single is a lone read, on the caller's ctx.
func (co *coalescer) single(ctx context.Context, key string) ([]byte, error) {
	rdb := co.client
	if rdb == nil {
		var err error
		if rdb, err = co.cluster.MasterForKey(ctx, key); err != nil {
			return nil, err
		}
	}
	b, err := rdb.Get(ctx, key).Bytes()
	if isWrongType(err) { // as MGET says of it
		err = redis.Nil
	}
	return b, err
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

		ctx := co.deadline()
		if co.client != nil {
			co.mget(ctx, co.client, batch)
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

// mget answers reads, all of one slot on a cluster, with one MGET.
func (co *coalescer) mget(ctx context.Context, rdb *redis.Client, reads []*pendingRead) {
	answer(reads, rdb.MGet(ctx, keysOf(reads)...))
}

// perMaster answers reads on a cluster: an MGET per slot, those of one
// master in one pipeline, the masters' pipelines concurrently.
func (co *coalescer) perMaster(ctx context.Context, reads []*pendingRead) {
	bySlot := map[uint16][]*pendingRead{}
	for _, r := range reads {
		s := slot.Of(r.key)
		bySlot[s] = append(bySlot[s], r)
	}
	byMaster := map[*redis.Client][][]*pendingRead{}
	for _, rs := range bySlot {
		node, err := co.cluster.MasterForKey(ctx, rs[0].key)
		if err != nil {
			fail(rs, err)
			continue
		}
		byMaster[node] = append(byMaster[node], rs)
	}
	var wg sync.WaitGroup
	for node, slots := range byMaster {
		wg.Go(func() { pipeMGets(ctx, node, slots) })
	}
	wg.Wait()
}

// pipeMGets sends one MGET per slot to node in one pipeline.
func pipeMGets(ctx context.Context, node *redis.Client, slots [][]*pendingRead) {
	if len(slots) == 1 {
		answer(slots[0], node.MGet(ctx, keysOf(slots[0])...))
		return
	}
	cmds := make([]*redis.SliceCmd, len(slots))
	_, perr := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, rs := range slots {
			cmds[i] = p.MGet(ctx, keysOf(rs)...)
		}
		return nil
	})
	for i, cmd := range cmds {
		if cmd.Err() == nil && cmd.Val() == nil && perr != nil {
			cmd.SetErr(perr) // go-redis before v9.7 leaves the commands of a pipeline it could not send untouched
		}
		answer(slots[i], cmd)
	}
}

// answer gives each read its value from an MGET, or the MGET's error.
func answer(reads []*pendingRead, cmd *redis.SliceCmd) {
	vals, err := cmd.Result()
	if err == nil && len(vals) != len(reads) {
		err = errors.New("cache: redis: MGET replied with the wrong number of values")
	}
	if err != nil {
		fail(reads, err)
		return
	}
	for i, r := range reads {
		switch v := vals[i].(type) {
		case string:
			r.val = []byte(v)
		default: // nil: no value, or one of another type
			r.err = redis.Nil
		}
	}
}

func fail(reads []*pendingRead, err error) {
	for _, r := range reads {
		r.err = err
	}
}

func keysOf(reads []*pendingRead) []string {
	keys := make([]string, len(reads))
	for i, r := range reads {
		keys[i] = r.key
	}
	return keys
}
