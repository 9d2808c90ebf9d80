// This file tests the connections a hub shares: which prefixes they track, overlapping prefixes on one connection, and a change of masters.

package coherence

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Redis refuses overlapping prefixes on one connection: a hub tracks only
// those no other covers, and the empty prefix covers every one.
func TestMinimalPrefixes(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{name: "none", in: nil, want: nil},
		{name: "disjoint", in: []string{"b:", "a:"}, want: []string{"a:", "b:"}},
		{name: "nested", in: []string{"a:b:", "a:", "a:c:"}, want: []string{"a:"}},
		{name: "empty covers all", in: []string{"a:", "", "b:"}, want: []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := map[string]int{}
			for _, p := range tt.in {
				ps[p]++
			}
			assert.ElementsMatch(t, tt.want, minimalPrefixes(ps), "minimalPrefixes(%q)", tt.in)
		})
	}
}

// Trackers of nested prefixes on one hub share one connection, which Redis
// accepts (it tracks the outer prefix only), and each hears the writes
// under its own prefix: the outer one those of the inner one too, since its
// keys include them.
func TestNestedPrefixesShareAConnection(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	hub := NewHub(redistest.Client(t, addr))
	defer hub.Close()
	var inner, outer atomic.Int64
	count := func(n *atomic.Int64, key string) Hooks {
		return Hooks{OnDrop: func(k string, all bool) {
			if k == key {
				n.Add(1)
			}
		}}
	}
	in := hub.New(p+"in:", time.Second, count(&inner, p+"in:k"))
	defer in.Close()
	out := hub.New(p, time.Second, count(&outer, p+"in:k"))
	defer out.Close()
	other := hub.New(p+"other:", time.Second, count(&inner, p+"in:k"))
	defer other.Close()
	require.True(t, eventually(func() bool { return in.Serving() && out.Serving() && other.Serving() }), "never serving")
	require.Len(t, hub.ConnIDs(), 1)

	require.NoError(t, admin.Set(t.Context(), p+"in:k", 1, 0).Err())
	assert.True(t, eventually(func() bool { return inner.Load() == 1 && outer.Load() == 1 }),
		"invalidations heard: inner %d, outer %d; want 1 each", inner.Load(), outer.Load())
	time.Sleep(50 * time.Millisecond)
	assert.EqualValues(t, 1, inner.Load(), "a tracker heard a key outside its prefix")
}

// Trackers of one hub closed one after the other: the second one's Close
// sees the subscription changes of the first's, which must not make it sure
// again nor renew the lease it just gave back (writers would wait it out).
func TestClosedTrackerStaysClosed(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	for round := range 10 {
		pb := fmt.Sprintf("%sb%d:", p, round)
		hub := NewHub(redistest.Client(t, addr))
		a := hub.New(fmt.Sprintf("%sa%d:", p, round), 2*time.Second, Hooks{})
		b := hub.New(pb, 2*time.Second, Hooks{})
		require.True(t, eventually(func() bool { return a.Serving() && b.Serving() }), "never serving")
		require.True(t, eventually(func() bool { return admin.HExists(t.Context(), RegistryKey(pb), b.ID()).Val() }), "never registered")
		a.Close()
		b.Close()
		time.Sleep(100 * time.Millisecond) // a renewal that was made ready would have run
		assert.False(t, b.Sure() || b.Serving(), "round %d: a closed tracker is sure again", round)
		assert.False(t, admin.HExists(t.Context(), RegistryKey(pb), b.ID()).Val(), "round %d: a closed tracker renewed its lease", round)
		hub.Close()
	}
}

// Close gives the lease back, then pings every tracking connection still
// subscribed to take in the markers of writes that counted on it: one
// connection in doubt (a Ring shard reconnecting) must not keep the others
// from being pinged.
func TestResignPingsEverySubscribedConnection(t *testing.T) {
	a := redistest.PrivateServer(t, "it runs a two-shard Ring")
	b := redistest.NewServer(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	// A lease so long that no renewal pings meanwhile.
	tr := New(ring, "resign:", 40*time.Second, Hooks{})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	conns := tr.hub.conns()
	require.Len(t, conns, 2)
	pinged := func(n *node) uint64 {
		n.pingMu.Lock()
		defer n.pingMu.Unlock()
		return n.pingSeq
	}
	for round := range 10 {
		down, up := conns[round%2].n, conns[(round+1)%2].n
		down.subbed.Store(false)
		before := pinged(up)
		tr.resign()
		assert.Greater(t, pinged(up), before, "round %d: the subscribed connection was not pinged", round)
		assert.GreaterOrEqual(t, up.pong.Load(), pinged(up), "round %d: resign returned before its PONG", round)
		down.subbed.Store(true)
	}
}

// A change in the set of masters (here a Ring's shard removed: its keys now
// live on the other, whose writes this process never tracked for them)
// empties memory once the change is seen, and memory is served again over
// the connections left.
func TestShardRemovedEmptiesMemory(t *testing.T) {
	a, b := redistest.NewServer(t), redistest.NewServer(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	var drops atomic.Int64
	tr := New(ring, "shards:", time.Second, Hooks{OnDrop: func(_ string, all bool) {
		if all {
			drops.Add(1)
		}
	}})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	require.Len(t, tr.ConnIDs(), 2)
	before := drops.Load()
	ring.SetAddrs(map[string]string{"a": a.Addr})
	require.True(t, eventually(func() bool { return len(tr.ConnIDs()) == 1 }), "the removed shard's connection was kept")
	assert.Greater(t, drops.Load(), before, "memory kept across a change of masters")
	assert.True(t, eventually(tr.Serving), "never serving again")
}
