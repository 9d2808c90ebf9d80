// This file tests what the cache promises of its coalesced reads
// (internal/redisio tests the coalescing itself).

package cache

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
)

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
	gate := redistest.NewReadGate()
	rdbA.AddHook(gate)
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
	gate.Next(t) // lead's GET on the wire
	wg.Go(func() {
		firstV, firstErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { panic("loaded") })
	})
	queued(t, a, 1)
	gate.Release()
	require.Equal(t, []string{key}, gate.Next(t)) // the MGET ran and found v0
	require.NoError(t, b.Delete(t.Context(), key))

	wg.Go(func() { _, getErr = a.Get(t.Context(), key) })
	wg.Go(func() {
		laterV, laterErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	queued(t, a, 1) // Get's read waits for the next batch; GetOrLoad joined the flight
	gate.Open()
	wg.Wait()

	require.NoError(t, firstErr)
	assert.Equal(t, "v0", firstV, "the caller that began before the Delete")
	assert.ErrorIs(t, getErr, ErrCacheMiss, "a Get that began after the Delete returned")
	require.NoError(t, laterErr)
	assert.Equal(t, "v2", laterV, "a GetOrLoad that began after the Delete returned")
}
