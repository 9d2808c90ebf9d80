// This file tests what a tracking connection's messages do: a marker acknowledged only after the keys it follows were dropped, a flush, and a lost or silent connection's memory dropped before it serves again.

package coherence

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A holder acknowledges a write only once it has dropped the written key:
// the marker key comes in the batch of the write's invalidation, and counts
// after the keys it follows. A drop that takes 300 ms widens the gap that
// an acknowledgement sent first would leave: the writer must not return
// before the drop ended.
func TestAcknowledgementFollowsTheDrop(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	const lease = 3 * time.Second
	const slow = 300 * time.Millisecond
	var dropped atomic.Int64 // drops of the key that ended
	holder := New(redistest.Client(t, addr), p, lease, Hooks{OnDrop: func(key string, all bool) {
		if !all && key == p+"k" {
			time.Sleep(slow)
			dropped.Add(1)
		}
	}})
	defer holder.Close()
	require.True(t, eventually(holder.Serving), "never serving")
	// A registry older than a lease, or the write waits one lease whatever
	// the acknowledgements.
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err())
	wrdb := redistest.Client(t, addr)
	var lapses atomic.Int64
	w := NewWriter(wrdb, p, lease, Hooks{OnLapse: func(string) { lapses.Add(1) }})
	defer w.Close()

	for i := range 3 {
		write(t, w, wrdb, p+"k", i)
		assert.GreaterOrEqual(t, dropped.Load(), int64(i+1), "write %d returned while the holder was still dropping the key", i)
	}
	assert.Zero(t, lapses.Load(), "the writer waited out a running lease")
}

// dialGate is a dialer that refuses while shut: a connection lost then
// stays lost until the gate opens.
type dialGate struct{ shut atomic.Bool }

func (g *dialGate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if g.shut.Load() {
		return nil, errors.New("dial gate shut")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// A tracking connection killed is a loss: memory stops being served at
// once, not when the lease ends nor at the next renewal (ten seconds away
// here), and a key written while the connection was down, whose
// invalidation nobody sent, is dropped before memory is served again.
func TestMemoryDroppedAcrossAReconnect(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	gate := &dialGate{}
	rdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: gate.dial})
	t.Cleanup(func() { _ = rdb.Close() })
	var held atomic.Bool // the old value of k is in memory
	tr := New(rdb, p, 40*time.Second, Hooks{OnDrop: func(key string, all bool) {
		if all || key == p+"k" {
			held.Store(false)
		}
	}})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	ctx := t.Context()
	before := tr.Ticket(p + "k")
	require.NoError(t, admin.Set(ctx, p+"k", "old", 0).Err())
	require.True(t, eventually(func() bool { return tr.Invalidated(before) }), "the first write never heard")
	tk := tr.Ticket(p + "k")
	require.Equal(t, "old", rdb.Get(ctx, p+"k").Val())
	held.Store(true)
	require.True(t, tr.Valid(tk), "the read of the old value was voided")

	ids := tr.ConnIDs()
	require.Len(t, ids, 1)
	gate.shut.Store(true)
	require.NoError(t, admin.ClientKillByFilter(ctx, "ID", strconv.FormatInt(ids[0], 10)).Err())
	require.True(t, eventually(func() bool { return !tr.Serving() }), "served after its tracking connection was killed")
	require.NoError(t, admin.Set(ctx, p+"k", "new", 0).Err()) // nobody hears it
	time.Sleep(100 * time.Millisecond)                        // redials refused meanwhile
	gate.shut.Store(false)

	stale := false
	require.True(t, redistest.Eventually(10*time.Second, func() bool {
		if !tr.Serving() {
			return false
		}
		stale = held.Load() // read after Serving: true means both at once
		return true
	}), "never serving again")
	assert.False(t, stale, "serving again with the value of a key written while the connection was down")
	assert.NotEqual(t, ids[0], tr.ConnIDs()[0], "not a new connection")
}

// A tracking connection that stops delivering, its socket still open (a
// proxy holds back its replies), is noticed: the PING sent on a connection
// quiet for a second gets no answer, and the connection is replaced by a
// new one, which serves again long before the lease (40 s) would end.
func TestSilentConnectionIsReplaced(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	proxy := redistest.NewProxy(t, addr)
	tr := New(redistest.Client(t, proxy.Addr), p, 40*time.Second, Hooks{})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	ids := tr.ConnIDs()
	require.Len(t, ids, 1)
	release := proxy.Hold(t, admin, ids[0])
	defer release()
	assert.True(t, redistest.Eventually(10*time.Second, func() bool {
		id := tr.ConnIDs()[0]
		return id != 0 && id != ids[0] && tr.Serving()
	}), "the silent connection was never replaced")
}

// A flush (FLUSHALL, FLUSHDB: an invalidation with no keys) empties
// memory and voids every read in flight; the connection is still
// subscribed, so memory is served again at once.
func TestFlushEmptiesMemory(t *testing.T) {
	srv := redistest.PrivateServer(t, "it flushes the server")
	admin := redistest.Client(t, srv.Addr)
	var all atomic.Int64
	tr := New(redistest.Client(t, srv.Addr), "p:", time.Second, Hooks{OnDrop: func(_ string, a bool) {
		if a {
			all.Add(1)
		}
	}})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	before := all.Load()
	tk := tr.Ticket("p:k")
	require.NoError(t, admin.FlushAll(t.Context()).Err())
	assert.True(t, eventually(func() bool { return all.Load() > before }), "a flush did not empty memory")
	assert.False(t, tr.Valid(tk), "a read begun before the flush may be kept")
	assert.True(t, tr.Serving(), "a flush stopped serving: the connection was taken for lost")
}
