// lease_test.go tests the renewal of a lease: the registry written, and the proof on every tracking connection that it counts on.

package coherence

import (
	"testing"
	"time"

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
	assert.True(t, eventuallyWithin(lease+lease/4, func() bool { return !tr.Serving() }),
		"still serving %v after its tracking connection's replies were held back", time.Since(held))
	assert.True(t, eventually(func() bool { return leaseEnd() > before }), "no renewal ran: the client did not answer")

	release()
	assert.True(t, eventuallyWithin(10*time.Second, tr.Serving), "never serving again once the replies flowed")
}
