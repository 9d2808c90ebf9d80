// This file tests how often a tracking connection redials a Redis that
// is down.

package coherence

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A tracking connection to a dead Redis backs off between its redials
// instead of dialling every 100ms: over 3s a fixed 100ms pause made 30
// dials, the backoff (100ms doubling up to redialMax, see redialBackoff)
// makes at most 7. It still comes back once Redis does.
func TestTrackingConnectionRedialsBackOff(t *testing.T) {
	var dials atomic.Int64
	var addr atomic.Value
	addr.Store(redistest.DeadAddr(t))
	dialer := func(ctx context.Context, network, _ string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr.Load().(string))
	}
	rdb := redis.NewClient(&redis.Options{Addr: "redis.invalid:6379", Dialer: dialer, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	live := redistest.Addr(t)
	tr := New(rdb, redistest.Prefix(t, redistest.Client(t, live)), time.Second, Hooks{})
	defer tr.Close()

	time.Sleep(3 * time.Second)
	n := dials.Load()
	t.Logf("%d dials in 3s", n)
	assert.LessOrEqual(t, n, int64(10), "dials of a dead Redis in 3s")
	assert.Positive(t, n, "never dialled")

	addr.Store(live) // Redis is back: serving again, within the backoff's cap
	require.True(t, redistest.Eventually(2*redialMax+3*time.Second, tr.Serving), "never serving once Redis was back")
}

// The redial backoff doubles from the first pause up to its cap, and a success
// starts it over.
func TestRedialDelay(t *testing.T) {
	var b redialBackoff
	longest := time.Duration(0)
	for range 20 {
		d := b.next()
		require.GreaterOrEqual(t, d, redialMin/2)
		require.LessOrEqual(t, d, redialMax)
		longest = max(longest, d)
	}
	assert.GreaterOrEqual(t, longest, redialMax/2, "never reached the cap")
	b.reset()
	assert.LessOrEqual(t, b.next(), redialMin, "a success did not start the backoff over")
}
