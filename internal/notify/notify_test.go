// This file proves the Notifier's own promises against a real Redis.

package notify

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Finish(m.Run()))
}

// backoff is the waits' duration in these tests: a wait that returns well
// within it was woken (or confirmed its subscribe), it did not run out.
const backoff = 5 * time.Second

// setup returns a client of the test Redis and a key prefix that is cleaned
// up after the test.
func setup(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	return rdb, redistest.Prefix(t, rdb)
}

// TestUnshardedSwitch forces SUBSCRIBE on the Redis 7 test server: the
// notifier subscribes with it and wakes on a PUBLISH of the key (what the
// scripts send on Redis < 7).
func TestUnshardedSwitch(t *testing.T) {
	rdb, p := setup(t)
	key := p + "k"
	ch := Channel("", key)
	n := New(rdb)
	n.plain = true
	defer n.Close()

	start := time.Now()
	assert.False(t, n.Wait(t.Context(), key, backoff), "the first wait subscribes")
	assert.Less(t, time.Since(start), backoff*4/5, "and returns once confirmed")
	assert.EqualValues(t, 1, rdb.PubSubNumSub(t.Context(), ch).Val()[ch], "SUBSCRIBE subscribers")
	assert.Zero(t, rdb.PubSubShardNumSub(t.Context(), ch).Val()[ch], "SSUBSCRIBE subscribers")

	start = time.Now()
	go func() {
		time.Sleep(50 * time.Millisecond)
		rdb.Publish(context.Background(), ch, key)
	}()
	assert.True(t, n.Wait(t.Context(), key, backoff), "woken by PUBLISH")
	assert.Less(t, time.Since(start), backoff*4/5)
}

// subs returns n's subscriptions.
func subs(n *Notifier) []*subscription {
	n.mu.Lock()
	defer n.mu.Unlock()
	var all []*subscription
	for _, s := range n.subs {
		all = append(all, s)
	}
	return all
}

// TestLifecycle: the subscription of a master is shared by its channels;
// an idle one is closed; Close ends them, twice, and later waits poll; a
// client it cannot subscribe on gets no Notifier.
func TestLifecycle(t *testing.T) {
	rdb, p := setup(t)
	n := New(rdb)
	var keys []string
	for i := range 5 {
		keys = append(keys, p+strings.Repeat("x", i+1))
	}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() { n.Wait(t.Context(), k, time.Second) })
	}
	wg.Wait()
	all := subs(n)
	require.Len(t, all, 1, "subscriptions of one master")
	n.mu.Lock()
	chans := len(all[0].chans)
	n.mu.Unlock()
	assert.Equal(t, len(keys), chans, "channels on it")

	// Idle: shortened here on the subscription's own timer.
	idleClosed := make(chan struct{})
	go func() { n.loops.Wait(); close(idleClosed) }()
	n.mu.Lock()
	if s := all[0]; s.idle != nil {
		s.idle.Reset(10 * time.Millisecond)
	}
	n.mu.Unlock()
	select {
	case <-idleClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle subscription was not closed")
	}
	assert.Empty(t, subs(n), "subscriptions after the idle period")

	// A new wait subscribes again; Close ends it; twice is fine; later waits poll.
	assert.False(t, n.Wait(t.Context(), keys[0], time.Second))
	assert.Len(t, subs(n), 1)
	n.Close()
	n.Close()
	assert.Empty(t, subs(n), "subscriptions after Close")
	start := time.Now()
	assert.False(t, n.Wait(t.Context(), keys[0], 50*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "a wait after Close polls")
	assert.Empty(t, subs(n), "subscriptions after a wait after Close")

	ring := redis.NewRing(&redis.RingOptions{})
	defer ring.Close()
	assert.Nil(t, New(ring), "a Ring polls")
}
