// This file tests the Tracker's face: tickets, serving, keys every value depends on, and Close giving the lease back.

package coherence

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventually polls cond for up to 5s (a loaded -race run is slow) and
// reports whether it held.
func eventually(cond func() bool) bool { return redistest.Eventually(5*time.Second, cond) }

// A ticket stays valid until its key's stripe or everything is invalidated,
// by this process or by a write in Redis; a zero ticket never is.
func TestTickets(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	tr := New(redistest.Client(t, addr), p, time.Second, Hooks{})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")

	assert.False(t, tr.Valid(Ticket{}), "a zero ticket is valid")
	assert.False(t, Ticket{}.OK())

	tk := tr.Ticket(p + "a")
	require.True(t, tk.OK())
	assert.True(t, tr.Valid(tk), "valid with nothing invalidated")
	other := "b"
	for i := 0; tr.stripe(p+other) == tk.stripe; i++ {
		other = "b" + string(rune('a'+i))
	}
	tr.Invalidate(p + other)
	assert.True(t, tr.Valid(tk), "voided by another stripe's invalidation")

	tr.Invalidate(p + "a")
	assert.False(t, tr.Valid(tk), "valid after its key's invalidation")
	assert.True(t, tr.Invalidated(tk))

	tk = tr.Ticket(p + "a")
	require.NoError(t, admin.Set(t.Context(), p+"a", "x", 0).Err())
	assert.True(t, eventually(func() bool { return !tr.Valid(tk) }), "valid after a write in Redis")
	assert.True(t, tr.Invalidated(tk))

	tk = tr.Ticket(p + "a")
	tr.dropAll(false)
	assert.False(t, tr.Valid(tk), "valid after a drop of everything")
	assert.False(t, tr.Invalidated(tk), "a drop of everything counted as the key's invalidation")
}

// A serving tracker is in the registry; Close stops serving and gives the
// lease back.
func TestCloseResignsTheLease(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	tr := New(redistest.Client(t, addr), p, time.Second, Hooks{})
	require.True(t, eventually(tr.Serving), "never serving")
	require.True(t, eventually(func() bool { return admin.HExists(t.Context(), RegistryKey(p), tr.ID()).Val() }), "never registered")
	ids := tr.ConnIDs()
	require.Len(t, ids, 1)
	assert.NotZero(t, ids[0])
	ttl := admin.PTTL(t.Context(), RegistryKey(p)).Val()
	assert.True(t, ttl > 0 && ttl <= 3*time.Second, "the registry lives three leases past the last renewal; PTTL %v", ttl)
	tr.Close()
	assert.False(t, tr.Serving(), "serving after Close")
	assert.False(t, admin.HExists(t.Context(), RegistryKey(p), tr.ID()).Val(), "a closed tracker still holds its lease")
}

// A key every value depends on (Hooks.Global: the tag versions) written in
// Redis empties memory and voids every read in flight, not only those of
// its stripe.
func TestGlobalKeyEmptiesMemory(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	var all atomic.Int64
	tr := New(redistest.Client(t, addr), p, time.Second, Hooks{
		OnDrop: func(_ string, a bool) {
			if a {
				all.Add(1)
			}
		},
		Global: func(key string) bool { return key == p+"version" },
	})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	value := "value"
	for i := 0; tr.stripe(p+value) == tr.stripe(p+"version"); i++ {
		value = "value" + string(rune('a'+i))
	}
	before := all.Load()
	tk := tr.Ticket(p + value)
	require.NoError(t, admin.Set(t.Context(), p+"version", 1, 0).Err())
	assert.True(t, eventually(func() bool { return all.Load() > before }), "the global key's write did not empty memory")
	assert.False(t, tr.Valid(tk), "a read of another key, begun before, may be kept")
}
