// This file tests the writer's side: what it waits for, and a write acknowledged.

package coherence

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLeases(t *testing.T) {
	tests := []struct {
		name       string
		reply      []any
		now, since int64
		leases     map[string]int64
		bad        bool
	}{
		{name: "empty registry", reply: []any{int64(100), int64(100)}, now: 100, since: 100, leases: map[string]int64{}},
		{name: "two holders", reply: []any{int64(100), int64(7), "a", int64(900), "b", int64(50)}, now: 100, since: 7,
			leases: map[string]int64{"a": 900, "b": 50}},
		{name: "too short", reply: []any{int64(100)}, bad: true},
		{name: "odd length", reply: []any{int64(100), int64(7), "a"}, bad: true},
		{name: "time not a number", reply: []any{"100", int64(7)}, bad: true},
		{name: "holder not a string", reply: []any{int64(100), int64(7), int64(1), int64(900)}, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now, since, leases, err := parseLeases(tt.reply)
			if tt.bad {
				require.Error(t, err, "parseLeases(%v)", tt.reply)
				assert.Contains(t, err.Error(), "unexpected confirmation reply")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.now, now, "now")
			assert.Equal(t, tt.since, since, "since")
			assert.Equal(t, tt.leases, leases)
		})
	}
}

// A writer waits for other holders whose lease runs, each until its lease's
// end stretched by the drift, not for itself nor for ended leases; and a
// registry younger than a lease makes it wait until a lease after its
// creation.
func TestDeadlines(t *testing.T) {
	tr := &Tracker{id: "me", lease: time.Second}
	recv := int64(time.Hour)
	stretch := func(ms int64) int64 {
		return recv + int64(float64(time.Duration(ms)*time.Millisecond)*(1+leaseDrift)) + int64(leaseMargin)
	}
	reply := []any{int64(10_000), int64(5_000), "me", int64(10_900), "a", int64(10_500), "gone", int64(9_000), "b", int64(10_000)}
	need, grace, err := tr.deadlines(reply, recv)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"a": stretch(500)}, need)
	assert.Zero(t, grace, "a registry older than a lease")

	need, grace, err = tr.deadlines([]any{int64(10_000), int64(9_600)}, recv)
	require.NoError(t, err)
	assert.Empty(t, need)
	assert.Equal(t, stretch(600), grace, "a registry created 400ms ago")
}

// A write through one tracker is acknowledged by another process's tracker
// (its own client): the holder drops the key, the writer does not wait out
// its lease, and a second write is acknowledged too. On a single server,
// the write and its marker key go in one pipeline.
func TestWriteIsAcknowledged(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	var dropped atomic.Int64
	holder := New(redistest.Client(t, addr), p, 3*time.Second, Hooks{OnDrop: func(key string, all bool) {
		if all || key == p+"k" { // emptying memory drops it too
			dropped.Add(1)
		}
	}})
	defer holder.Close()
	var lapses atomic.Int64
	wrdb := redistest.Client(t, addr)
	writer := New(wrdb, p, 3*time.Second, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer writer.Close()
	require.True(t, eventually(func() bool { return holder.Serving() && writer.Serving() }), "never serving")
	dropped.Store(0) // the drops of becoming sure
	// A registry older than a lease, or the write waits one lease whatever
	// the acknowledgements.
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err())

	for i := range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second) // under the holder's lease
		wait, err := writer.Write(ctx, []string{p + "k"},
			func(pl redis.Pipeliner) { pl.Set(ctx, p+"k", i, 0) },
			func() error { return wrdb.Set(ctx, p+"k", i, 0).Err() })
		require.NoError(t, err)
		require.NoError(t, wait(), "write %d: not confirmed before the holder's lease could end", i)
		cancel()
		assert.GreaterOrEqual(t, dropped.Load(), int64(i+1), "write %d returned before the holder dropped the key", i)
	}
	assert.Zero(t, lapses.Load(), "the writer waited out a running lease")
	assert.Equal(t, "1", admin.Get(t.Context(), p+"k").Val())
}

// markers subscribes to the marker channel of p and returns a count of
// what was published there so far (a PING's PONG follows every message
// published before it).
func markers(t *testing.T, addr, p string) func() int {
	t.Helper()
	rdb := redistest.Client(t, addr)
	sub := rdb.Subscribe(t.Context(), markChannel(p))
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(t.Context())
	require.NoError(t, err)
	n := 0
	return func() int {
		require.NoError(t, sub.Ping(t.Context()))
		for {
			msg, err := sub.Receive(t.Context())
			require.NoError(t, err)
			switch msg.(type) {
			case *redis.Message:
				n++
			case *redis.Pong:
				return n
			}
		}
	}
}

// On a single server the marker is a key that the write's own pipeline
// writes and deletes, whose invalidation reaches every holder after the
// write's: a write is acknowledged without the marker being published,
// which the writer does only to ask again for an acknowledgement it
// missed.
func TestSingleServerMarkerIsAKey(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	const lease = 3 * time.Second
	holder := New(redistest.Client(t, addr), p, lease, Hooks{})
	defer holder.Close()
	wrdb := redistest.Client(t, addr)
	var lapses atomic.Int64
	w := New(wrdb, p, lease, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer w.Close()
	require.True(t, eventually(func() bool { return holder.Serving() && w.Serving() }), "never serving")
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err())
	published := markers(t, addr, p)
	for i := range 3 {
		write(t, w, wrdb, p+"k", i)
	}
	assert.Zero(t, published(), "markers published: the marker key did not reach the holder")
	assert.Zero(t, lapses.Load())
}

// While acknowledgements are missing the writer publishes its marker again
// every quarter lease, at most maxAsks times; not when none is missing.
func TestWriterAsksAgainWhileAcknowledgementsAreMissing(t *testing.T) {
	addr := redistest.Addr(t)
	p := redistest.Prefix(t, redistest.Client(t, addr))
	tr := &Tracker{rdb: redistest.Client(t, addr), markCh: markChannel(p), lease: time.Second}
	published := markers(t, addr, p)
	quarter := int64(tr.lease / 4)
	a := &asker{t: tr, marker: "w:1", next: quarter}
	a.step(t.Context(), quarter, 0, false)
	require.True(t, eventually(func() bool { return !a.asking.Load() }))
	assert.Zero(t, published(), "asked with nothing missing")
	for i := range 6 {
		now := int64(i) * quarter
		a.step(t.Context(), now, now+10*quarter, true)
		require.True(t, eventually(func() bool { return !a.asking.Load() }))
	}
	assert.Equal(t, 2, published(), "asks in six quarter leases: want maxAsks, at most twice as documented")
}
