// refresh_test.go proves early refresh: a hot key is reloaded in the
// background before it expires, once per key across instances, and no
// caller meets a miss.

package cache

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventCounts counts events by kind.
type eventCounts [EventBreakerClose + 1]atomic.Int64

func (e *eventCounts) observe(ev Event) { e[ev.Kind].Add(1) }

func TestEarlyRefreshReloadsBeforeExpiry(t *testing.T) {
	rdb, p := setup(t)
	key := p + "hot"
	var ev eventCounts
	c := New[product](rdb, WithTTL(time.Second), WithoutJitter(), WithEarlyRefresh(50), WithObserver(ev.observe))
	src := &counter{delay: 20 * time.Millisecond}
	v, err := c.GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)
	require.Equal(t, 1, v.Price)

	// Hit until a refresh has run; none of these calls may load or miss.
	waitFor(t, func() bool {
		v, err := c.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
		return v.Price == 2
	})
	require.NoError(t, c.Close())
	assert.Equal(t, int64(1), ev[EventMiss].Load(), "only the cold read may miss")
	assert.Equal(t, src.calls.Load()-1, ev[EventRefresh].Load(), "every load after the first must be a background refresh")
	assert.Greater(t, rdb.PTTL(t.Context(), key).Val(), 500*time.Millisecond, "the refresh must store the value for a new TTL")
}

func TestEarlyRefreshOffNeverRefreshes(t *testing.T) {
	rdb, p := setup(t)
	var ev eventCounts
	c := New[product](rdb, WithTTL(time.Minute), WithEarlyRefresh(0), WithObserver(ev.observe))
	src := &counter{}
	for range 50 {
		_, err := c.GetOrLoad(t.Context(), p+"k", src.load)
		require.NoError(t, err)
	}
	require.NoError(t, c.Close())
	assert.Equal(t, int64(1), src.calls.Load())
	assert.Zero(t, ev[EventRefresh].Load())
	raw, err := rdb.Get(t.Context(), p+"k").Bytes()
	require.NoError(t, err)
	assert.Equal(t, []byte{recordV1, 0, 0}, raw[:headerLen], "no freshness metadata when nothing reads it")
}

// TestEarlyRefreshKeepsAHotKeyWarmAcrossInstances: 4 instances hit one key
// across several TTLs; the key is loaded about once per TTL and no caller
// after the cold start meets a miss.
func TestEarlyRefreshKeepsAHotKeyWarmAcrossInstances(t *testing.T) {
	_, p := setup(t)
	key := p + "hot"
	addr := redistest.Addr(t)
	var ev eventCounts
	src := &counter{delay: 100 * time.Millisecond}
	const ttl = time.Second
	var caches []*Cache[product]
	for range 4 {
		caches = append(caches, New[product](redistest.Client(t, addr), WithTTL(ttl), WithoutJitter(),
			WithEarlyRefresh(2), WithObserver(ev.observe)))
	}
	_, err := caches[0].GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)

	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range caches {
		for range 4 {
			wg.Go(func() {
				for time.Since(start) < 3*ttl {
					if _, err := c.GetOrLoad(t.Context(), key, src.load); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	for _, c := range caches {
		require.NoError(t, c.Close())
	}
	// Refreshes land some load durations before expiry, so a little more
	// than one per TTL; a refresh per instance would be 4 per TTL.
	periods := int64(time.Since(start)/ttl) + 1
	assert.Equal(t, int64(1), ev[EventMiss].Load(), "no caller may meet a miss after the cold start")
	assert.LessOrEqual(t, src.calls.Load(), 1+2*periods, "about one load per TTL across all instances")
	assert.GreaterOrEqual(t, src.calls.Load(), periods, "the key must have been refreshed every TTL")
}
