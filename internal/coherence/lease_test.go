// This file tests the renewal of a lease: the registry written, and the proof on every tracking connection that it counts on.

package coherence

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A renewal counts only with its proof, a PONG on every tracking
// connection. The tracking connection's replies held back (a proxy stalls
// them) while the client still answers: renewals keep writing the
// registry, yet memory stops being served within a lease of the hold,
// before the silent connection is noticed (a second or two), and is served
// again once the replies flow.
func TestRenewalNeedsAPongOnEveryConnection(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	proxy := redistest.NewProxy(t, addr)
	const lease = 600 * time.Millisecond // under the silence check's two seconds
	tr := New(redistest.Client(t, proxy.Addr), p, lease, Hooks{})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	ids := tr.ConnIDs()
	require.Len(t, ids, 1)
	leaseEnd := func() int64 {
		v, _ := admin.HGet(t.Context(), RegistryKey(p), tr.ID()).Int64()
		return v
	}

	held := time.Now()
	release := proxy.Hold(t, admin, ids[0])
	defer release()
	before := leaseEnd()
	// A renewal made before the hold ends its lease within a lease; one
	// that skipped its proof would keep serving until the silence check
	// drops the connection.
	assert.True(t, redistest.Eventually(lease+lease/4, func() bool { return !tr.Serving() }),
		"still serving %v after its tracking connection's replies were held back", time.Since(held))
	assert.True(t, eventually(func() bool { return leaseEnd() > before }), "no renewal ran: the client did not answer")

	release()
	assert.True(t, redistest.Eventually(10*time.Second, tr.Serving), "never serving again once the replies flowed")
}

// A lease counts from before the renewal's script ran: the server's TIME
// is read at some moment after the holder noted its clock, so a reply that
// comes late (held back a second here) must not stretch the lease past
// the moment the renewal began plus one lease.
func TestLeaseCountsFromBeforeTheScript(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	proxy := redistest.NewProxy(t, addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 1}) // the renewals' one connection
	t.Cleanup(func() { _ = rdb.Close() })
	// Long: no renewal of its own comes during the test (a quarter lease
	// apart), and its 1% drift margin (400 ms) is under the delay.
	const lease = 40 * time.Second
	tr := New(rdb, p, lease, Hooks{})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	id, err := rdb.ClientID(t.Context()).Result()
	require.NoError(t, err)

	release := proxy.Hold(t, admin, id)
	began := nanotime()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.renew(t.Context())
	}()
	time.Sleep(time.Second)
	release()
	<-done
	over := time.Duration(tr.leaseUntil.Load() - began - int64(lease))
	assert.LessOrEqual(t, over, time.Duration(0), "the lease runs %v past a lease from the renewal's start", over)
}

// A renewal counts only if its script ran on a server that a tracking
// connection is on. A client moved to another server (as a Sentinel
// failover moves it, closing its connections to the old master) while the
// tracking connection stays on the old one, which still answers: memory
// is dropped, and the tracking connection moves to the client's server,
// where memory is served again.
func TestRenewalOnAnotherServerMovesTheConnection(t *testing.T) {
	a := redistest.PrivateServer(t, "it moves a client between two servers")
	b := redistest.PrivateServer(t, "it moves a client between two servers")
	var target atomic.Value
	target.Store(a.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: "switched", Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, target.Load().(string))
	}})
	t.Cleanup(func() { _ = rdb.Close() })
	var drops atomic.Int64
	tr := New(rdb, "sw:", time.Second, Hooks{OnDrop: func(_ string, all bool) {
		if all {
			drops.Add(1)
		}
	}})
	defer tr.Close()
	require.True(t, eventually(tr.Serving), "never serving")
	before := drops.Load()

	target.Store(b.Addr)
	require.NoError(t, redistest.Client(t, a.Addr).ClientKillByFilter(t.Context(), "TYPE", "normal").Err())
	onB := func() bool {
		return strings.Contains(redistest.Client(t, b.Addr).ClientList(t.Context()).Val(), "name="+ClientName)
	}
	require.True(t, eventually(onB), "the tracking connection did not move to the client's server")
	assert.Greater(t, drops.Load(), before, "memory not dropped")
	assert.True(t, eventually(tr.Serving), "never serving again on the new server")
}
