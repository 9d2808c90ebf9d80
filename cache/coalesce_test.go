package cache

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
)

// readGate holds the reply of every GET and MGET, once the server has
// answered it, until the test lets it go; off, it lets reads through.
type readGate struct {
	on      atomic.Bool
	replied chan []string // the keys of a read the server answered, its reply held
	release chan struct{} // lets one held reply go
}

func newReadGate(rdb *redis.Client) *readGate {
	g := &readGate{replied: make(chan []string, 64), release: make(chan struct{})}
	g.on.Store(true)
	rdb.AddHook(g)
	return g
}

func (g *readGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *readGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if (cmd.Name() == "get" || cmd.Name() == "mget") && g.on.Load() {
			var keys []string
			for _, a := range cmd.Args()[1:] {
				keys = append(keys, a.(string))
			}
			g.replied <- keys
			<-g.release
		}
		return err
	}
}
func (g *readGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// next waits for the next read the server answered and returns its keys.
func (g *readGate) next(t *testing.T) []string {
	t.Helper()
	select {
	case keys := <-g.replied:
		return keys
	case <-time.After(10 * time.Second):
		t.Fatal("no read reached the server")
		return nil
	}
}

// open lets every read through from now on, the held one included.
func (g *readGate) open() {
	g.on.Store(false)
	close(g.release)
}

// queued waits until n reads wait for the next batch.
func queued(t *testing.T, co *coalescer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		co.mu.Lock()
		got := len(co.queue)
		co.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued; want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentReadsGoOutAsOneMGet: 50 flights for 50 keys while a GET is
// on the wire: the 49 that arrived meanwhile go out as one MGET, not 49
// GETs.
func TestConcurrentReadsGoOutAsOneMGet(t *testing.T) {
	rdb, p := setup(t)
	c := New[product](rdb, WithoutNearCache()) // the Redis read path; it adds hooks to a client in use
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = p + strconv.Itoa(i)
		require.NoError(t, c.Set(t.Context(), keys[i], product{ID: keys[i]}))
	}
	cmds := countCommands(rdb)
	gate := newReadGate(rdb)
	var wg sync.WaitGroup
	var wrong atomic.Int64
	src := &counter{}
	read := func(k string) {
		v, err := c.GetOrLoad(t.Context(), k, src.load)
		if err != nil || v.ID != k {
			wrong.Add(1)
		}
	}
	wg.Go(func() { read(keys[0]) })
	assert.Equal(t, []string{keys[0]}, gate.next(t), "a lone read goes out at once, as a GET")
	for _, k := range keys[1:] {
		wg.Go(func() { read(k) })
	}
	queued(t, c.reads, 49)
	gate.release <- struct{}{}
	assert.ElementsMatch(t, keys[1:], gate.next(t), "the reads queued meanwhile go out together")
	gate.open()
	wg.Wait()
	assert.Zero(t, wrong.Load())
	assert.Zero(t, src.calls.Load())
	assert.Equal(t, 1, cmds.get("get"))
	assert.Equal(t, 1, cmds.get("mget"))
}

// TestBatchInFlightDoesNotServeLaterCallers: an MGET ran on the server (its
// reply not yet back) before a Delete; a Get and a GetOrLoad that begin
// after the Delete returned must not be answered by it.
func TestBatchInFlightDoesNotServeLaterCallers(t *testing.T) {
	_, p := setup(t)
	lead, key := p+"lead", p+"item"
	addr := redistest.Addr(t)
	rdbA := redistest.Client(t, addr)
	// The gate goes on before a exists: a's near cache uses rdbA at once, and
	// go-redis before v9.6 does not allow adding a hook to a client in use.
	gate := newReadGate(rdbA)
	a := New[string](rdbA)
	b := New[string](redistest.Client(t, addr))
	require.NoError(t, b.Set(t.Context(), lead, "lead"))
	require.NoError(t, b.Set(t.Context(), key, "v0"))

	var wg sync.WaitGroup
	var firstV, laterV string
	var firstErr, laterErr, getErr error
	wg.Go(func() {
		_, _ = a.GetOrLoad(t.Context(), lead, func(context.Context) (string, error) { return "", nil })
	})
	gate.next(t) // lead's GET on the wire
	wg.Go(func() {
		firstV, firstErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { panic("loaded") })
	})
	queued(t, a.reads, 1)
	gate.release <- struct{}{}
	require.Equal(t, []string{key}, gate.next(t)) // the MGET ran and found v0
	require.NoError(t, b.Delete(t.Context(), key))

	wg.Go(func() { _, getErr = a.Get(t.Context(), key) })
	wg.Go(func() {
		laterV, laterErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	queued(t, a.reads, 1) // Get's read waits for the next batch; GetOrLoad joined the flight
	gate.open()
	wg.Wait()

	require.NoError(t, firstErr)
	assert.Equal(t, "v0", firstV, "the caller that began before the Delete")
	assert.ErrorIs(t, getErr, ErrCacheMiss, "a Get that began after the Delete returned")
	require.NoError(t, laterErr)
	assert.Equal(t, "v2", laterV, "a GetOrLoad that began after the Delete returned")
}

// TestReaderLeavesWhenItsCtxEndsDuringABatch: two reads in one MGET; the
// first one's ctx ends while the MGET's reply is held: it returns at once,
// the other still gets its value from the same MGET.
func TestReaderLeavesWhenItsCtxEndsDuringABatch(t *testing.T) {
	rdb, p := setup(t)
	c := New[string](rdb, WithoutNearCache()) // the Redis read path; it adds hooks to a client in use
	k1, k2 := p+"k1", p+"k2"
	require.NoError(t, c.Set(t.Context(), k1, "v1"))
	require.NoError(t, c.Set(t.Context(), k2, "v2"))
	cmds := countCommands(rdb)
	gate := newReadGate(rdb)

	var wg sync.WaitGroup
	wg.Go(func() { _, _ = c.Get(t.Context(), p+"lead") })
	gate.next(t)
	ctx1, cancel1 := context.WithCancel(t.Context())
	left := make(chan error, 1)
	wg.Go(func() {
		_, err := c.Get(ctx1, k1)
		left <- err
	})
	var v2 string
	var err2 error
	wg.Go(func() { v2, err2 = c.Get(t.Context(), k2) })
	queued(t, c.reads, 2)
	gate.release <- struct{}{}
	assert.ElementsMatch(t, []string{k1, k2}, gate.next(t))
	cancel1()
	select {
	case err := <-left:
		assert.True(t, errors.Is(err, context.Canceled), "Get = %v; want context.Canceled", err)
	case <-time.After(5 * time.Second):
		t.Fatal("a reader whose ctx ended waited for the batch")
	}
	gate.open()
	wg.Wait()
	require.NoError(t, err2, "the other reader of the batch")
	assert.Equal(t, "v2", v2)
	assert.Equal(t, 1, cmds.get("mget"))
}
