package freshness

import (
	"math"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/record"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEarlyRefreshDrawIsSharedAndFloored checks the refresh decision: due
// within one load duration of expiry whatever the draw, never far from it,
// and in between as often as XFetch says (P(max(1, -ln u) >= 2) = e^-2),
// from a draw that depends on the record only, so every process decides
// alike.
func TestEarlyRefreshDrawIsSharedAndFloored(t *testing.T) {
	p := Policy{Beta: 1}
	const load = 20 * time.Millisecond
	now := time.Now()
	at := func(left time.Duration, i int) (record.Freshness, []byte) {
		f := record.Freshness{Expiry: now.Add(left).Add(time.Duration(i) * time.Millisecond), Load: load}
		rec := record.EncodeFresh(0, f, nil)
		f, _ = record.ReadFreshness(rec)
		return f, rec
	}
	const n = 20000
	due := 0
	for i := range n {
		f, head := at(0, i)
		require.True(t, p.due(f, f.Expiry.Add(-load), head), "within one load duration of expiry a refresh is always due")
		require.False(t, p.due(f, f.Expiry.Add(-46*load), head), "far from expiry a refresh is never due")
		if p.due(f, f.Expiry.Add(-2*load), head) {
			due++
		}
	}
	assert.InDelta(t, math.Exp(-2), float64(due)/n, 0.01, "share of values due two load durations before expiry")
}

// TestAges: fresh before the expiry, stale within WithStale's d past it,
// due for refresh within the grace past it, then a miss; a throttled value
// is stale before its expiry.
func TestAges(t *testing.T) {
	now := time.Now()
	f := record.Freshness{Expiry: now, Load: 10 * time.Millisecond}
	p := Policy{Beta: 1, Stale: time.Second}
	assert.Equal(t, Fresh, p.Of(record.Freshness{}, false, now, nil), "no metadata")
	assert.Equal(t, Fresh, p.Of(f, false, now.Add(-time.Hour), nil))
	assert.Equal(t, Stale, p.Of(f, true, now.Add(-time.Hour), nil), "throttled")
	assert.Equal(t, Stale, p.Of(f, false, now.Add(time.Millisecond), nil))
	assert.Equal(t, Expired, p.Of(f, false, now.Add(2*time.Second), nil))
	p.Stale = 0
	assert.Equal(t, Refresh, p.Of(f, false, now.Add(time.Millisecond), nil), "within the grace")
	assert.Equal(t, Expired, p.Of(f, false, now.Add(31*time.Millisecond), nil))
	assert.Equal(t, 30*time.Millisecond, p.KeepPast(f.Load))
	assert.Equal(t, time.Duration(0), Policy{}.KeepPast(f.Load))
}
