// This file tests a writer without a near cache: acknowledged like any writer, no lease, a subscription only while needed.

package coherence

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dialed is a dialer that remembers its connections, so that a test can cut
// one as a network fault would.
type dialed struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *dialed) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	cn, err := nd.DialContext(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, cn)
		d.mu.Unlock()
	}
	return cn, err
}

// subscribed returns the connection that the server lists as subscribed.
func (d *dialed) subscribed(t *testing.T, admin *redis.Client) net.Conn {
	t.Helper()
	list, err := admin.ClientList(t.Context()).Result()
	require.NoError(t, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cn := range d.conns {
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " addr="+cn.LocalAddr().String()+" ") && strings.Contains(line, " sub=1 ") {
				return cn
			}
		}
	}
	t.Fatal("no subscribed connection")
	return nil
}

// subOpen reports whether the writer's acknowledgement subscription is open.
func subOpen(w *Tracker) bool {
	w.sub.mu.Lock()
	defer w.sub.mu.Unlock()
	return w.sub.conns != nil
}

// receiving reports whether a goroutine receives on the writer's
// acknowledgement subscription.
func receiving(w *Tracker) bool {
	w.sub.mu.Lock()
	defer w.sub.mu.Unlock()
	for _, c := range w.sub.conns {
		if c.receiving {
			return true
		}
	}
	return false
}

// write sets key through w and waits for its confirmation.
func write(t *testing.T, w *Tracker, rdb *redis.Client, key string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second) // under the holders' lease
	defer cancel()
	wait, err := w.Write(ctx, []string{key}, func(pl redis.Pipeliner) { pl.Set(ctx, key, v, 0) }, func() error { return rdb.Set(ctx, key, v, 0).Err() })
	require.NoError(t, err)
	require.NoError(t, wait(), "not confirmed before the holder's lease could end")
}

// A writer without a near cache is acknowledged by a holder: the holder
// drops the key before the write returns, the writer never waits out its
// lease, and the writer is not in the registry. Its subscription, opened by
// the first write that had a holder to wait for, survives a cut connection
// (the writes then ask again), closes once unused for ackLinger leases, and
// Close ends it.
func TestWriterIsAcknowledged(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	const lease = 3 * time.Second
	var dropped atomic.Int64
	holder := New(redistest.Client(t, addr), p, lease, Hooks{OnDrop: func(key string, all bool) {
		if all || key == p+"k" {
			dropped.Add(1)
		}
	}})
	defer holder.Close()
	require.True(t, eventually(holder.Serving), "never serving")
	dropped.Store(0) // the drops of becoming sure
	// A registry older than a lease, or the write waits one lease whatever
	// the acknowledgements.
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err())

	d := &dialed{}
	wrdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: d.dial})
	t.Cleanup(func() { _ = wrdb.Close() })
	var lapses atomic.Int64
	w := NewWriter(wrdb, p, lease, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer w.Close()
	assert.False(t, w.Serving(), "a writer serves memory")

	for i := range 3 {
		write(t, w, wrdb, p+"k", i)
		assert.GreaterOrEqual(t, dropped.Load(), int64(i+1), "write %d returned before the holder dropped the key", i)
	}
	assert.Zero(t, lapses.Load(), "the writer waited out a running lease")
	assert.False(t, admin.HExists(t.Context(), RegistryKey(p), w.ID()).Val(), "a writer without a near cache holds a lease")
	require.True(t, subOpen(w))
	assert.EqualValues(t, 1, w.sub.gen.Load(), "subscriptions confirmed")

	// The subscription's connection is cut: the next write's
	// acknowledgements are lost until go-redis subscribes again, and the
	// write asks again then, instead of waiting out the lease.
	require.NoError(t, d.subscribed(t, admin).Close())
	began := time.Now()
	write(t, w, wrdb, p+"k", "after the cut")
	assert.Less(t, time.Since(began), lease/2, "the write after the cut waited out the holder's lease")
	assert.Zero(t, lapses.Load())
	assert.EqualValues(t, 2, w.sub.gen.Load(), "subscriptions confirmed")

	// Unused, it closes after ackLinger leases; the next write opens it again.
	require.True(t, eventually(func() bool { return !receiving(w) }), "the receiving goroutine did not end with the last write")
	w.sub.mu.Lock()
	w.sub.used -= int64(ackLinger * lease)
	w.sub.idle.Reset(time.Millisecond)
	w.sub.mu.Unlock()
	require.True(t, eventually(func() bool { return !subOpen(w) }), "the idle subscription was not closed")
	write(t, w, wrdb, p+"k", "reopened")
	assert.Zero(t, lapses.Load())
	require.True(t, subOpen(w))
	w.Close()
	assert.False(t, subOpen(w), "open after Close")
}

// With no holder in the registry a writer opens no subscription and starts
// no goroutine: the write costs the registry's reply, in the write's own
// round trip on a single server.
func TestWriterWithoutHoldersListensToNothing(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0, "gone", 1).Err()) // an old registry, a lease long ended
	wrdb := redistest.Client(t, addr)
	w := NewWriter(wrdb, p, time.Second, Hooks{})
	defer w.Close()
	for i := range 5 {
		began := time.Now()
		write(t, w, wrdb, p+"k", i)
		assert.Less(t, time.Since(began), 500*time.Millisecond)
	}
	assert.False(t, subOpen(w), "a subscription with no holder to hear")
	assert.False(t, receiving(w), "a receiving goroutine with no write waiting")
	ttl := admin.PTTL(t.Context(), HoldRegistryKey(p)).Val()
	assert.Greater(t, ttl, 9*time.Minute, "with no lease running, a write keeps the per-key registry ten minutes")
	assert.Equal(t, time.Duration(-1), admin.PTTL(t.Context(), RegistryKey(p)).Val(), "a write changed the life of the registry its holders keep")
}

// On a Ring the writer subscribes on every shard, as a holder's tracking
// connections do: a holder's PUBLISH in a pipeline goes to any shard
// (go-redis routes it as a keyless command). The marker reaches the
// holder's connection to every shard.
func TestWriterIsAcknowledgedOnARing(t *testing.T) {
	a, b := redistest.NewServer(t), redistest.NewServer(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	const lease = 3 * time.Second
	const p = "wring:"
	holder := New(ring(), p, lease, Hooks{})
	defer holder.Close()
	require.True(t, eventually(holder.Serving), "never serving")
	require.NoError(t, ring().ForEachShard(t.Context(), func(ctx context.Context, c *redis.Client) error {
		return c.HSet(ctx, RegistryKey(p), "~since", 0).Err()
	}))
	wrdb := ring()
	var lapses atomic.Int64
	w := NewWriter(wrdb, p, lease, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer w.Close()
	for i := range 6 {
		key := p + "k" + string(rune('a'+i)) // keys on both shards
		ctx := t.Context()
		wait, err := w.Write(ctx, []string{key}, nil, func() error { return wrdb.Set(ctx, key, i, 0).Err() })
		require.NoError(t, err)
		require.NoError(t, wait())
	}
	assert.Zero(t, lapses.Load(), "the writer waited out the holder's lease: its acknowledgements did not reach it")
	w.sub.mu.Lock()
	assert.Len(t, w.sub.conns, 2, "subscriptions on a two-shard Ring")
	w.sub.mu.Unlock()
}
