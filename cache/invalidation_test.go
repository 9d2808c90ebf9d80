// This file proves that a Delete in another instance is seen by
// every caller that begins after it returns, even one that joins a flight
// begun before it.

package cache

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCallerAfterDeleteElsewhereDoesNotGetTheLoadInFlight: instance A is
// loading v1 when instance B deletes the key; a caller that starts on A
// after the Delete returned used to join A's flight and get v1.
func TestCallerAfterDeleteElsewhereDoesNotGetTheLoadInFlight(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "item"
	addr := redistest.Addr(t)
	a := New[string](redistest.Client(t, addr))
	b := New[string](redistest.Client(t, addr))

	loading, release := make(chan struct{}), make(chan struct{})
	var first struct {
		v   string
		err error
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		first.v, first.err = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) {
			close(loading)
			<-release
			return "v1", nil // read from the source before it changed
		})
	})
	<-loading
	require.NoError(t, b.Delete(t.Context(), key))

	var later struct {
		v   string
		err error
	}
	wg.Go(func() {
		later.v, later.err = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	time.Sleep(100 * time.Millisecond) // let later join the flight (if it does not, the test proves less, never fails wrongly)
	close(release)
	wg.Wait()

	require.NoError(t, first.err)
	assert.Equal(t, "v1", first.v, "a caller that began before the Delete may get the load it joined")
	require.NoError(t, later.err)
	assert.Equal(t, "v2", later.v, "a caller that began after the Delete returned got the load the Delete voided")
	got, err := a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v3", nil })
	require.NoError(t, err)
	assert.Equal(t, "v2", got, "the voided load must not have been stored")
}

// TestCallerAfterDeleteElsewhereDoesNotGetAReadInFlight: A's GET ran before
// B's Delete but its reply arrives after; a caller that joins A's flight
// after the Delete returned must not get the deleted value.
func TestCallerAfterDeleteElsewhereDoesNotGetAReadInFlight(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "item"
	addr := redistest.Addr(t)
	rdbA := redistest.Client(t, addr)
	// Without near caches: the test holds a read of the Redis path, and it
	// adds a hook to a client in use (a race on go-redis v9.5.5).
	a := New[string](rdbA, WithoutNearCache())
	b := New[string](redistest.Client(t, addr), WithoutNearCache())
	_, err := b.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v0", nil })
	require.NoError(t, err)

	gate := redistest.NewReadGate()
	rdbA.AddHook(gate)
	var wg sync.WaitGroup
	var firstV, laterV string
	var firstErr, laterErr error
	wg.Go(func() { firstV, firstErr = a.GetOrLoad(t.Context(), key, failLoad) })
	gate.Next(t) // GET has run on the server and returned v0
	require.NoError(t, b.Delete(t.Context(), key))
	wg.Go(func() {
		laterV, laterErr = a.GetOrLoad(t.Context(), key, func(context.Context) (string, error) { return "v2", nil })
	})
	time.Sleep(100 * time.Millisecond) // let later join the flight
	gate.Open()
	wg.Wait()

	require.NoError(t, firstErr)
	assert.Equal(t, "v0", firstV)
	require.NoError(t, laterErr)
	assert.Equal(t, "v2", laterV, "a caller that began after the Delete returned got the deleted value")
}

func failLoad(context.Context) (string, error) {
	panic("the loader must not run")
}
