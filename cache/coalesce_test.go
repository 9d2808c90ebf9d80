// This file tests what the cache promises of its coalesced reads
// (internal/redisio tests the coalescing itself).

package cache

import (
	"context"
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

// queued waits until n of c's reads wait for the next batch.
func queued[V any](t *testing.T, c *Cache[V], n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := c.redisio.Queued()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued; want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBatchInFlightDoesNotServeLaterCallers: an MGET ran on the server (its
// reply not yet back) before a Delete; a Get and a GetOrLoad that begin
// after the Delete returned must not be answered by it.
func TestBatchInFlightDoesNotServeLaterCallers(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	lead, key := p+"lead", p+"item"
	addr := redistest.Addr(t)
	rdbA := redistest.Client(t, addr)
	// The gate goes on before a exists: a's near cache uses rdbA at once, and
	// go-redis may not allow adding a hook to a client in use.
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
	queued(t, a, 1)
	gate.release <- struct{}{}
	require.Equal(t, []string{key}, gate.next(t)) // the MGET ran and found v0
	require.NoError(t, b.Delete(t.Context(), key))

	wg.Go(func() { _, getErr = a.Get(t.Context(), key) })
	wg.Go(func() {
		laterV, laterErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	queued(t, a, 1) // Get's read waits for the next batch; GetOrLoad joined the flight
	gate.open()
	wg.Wait()

	require.NoError(t, firstErr)
	assert.Equal(t, "v0", firstV, "the caller that began before the Delete")
	assert.ErrorIs(t, getErr, ErrCacheMiss, "a Get that began after the Delete returned")
	require.NoError(t, laterErr)
	assert.Equal(t, "v2", laterV, "a GetOrLoad that began after the Delete returned")
}
