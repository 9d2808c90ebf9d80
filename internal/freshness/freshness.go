// Package freshness decides what a record's age calls for: serve it,
// refresh it early (XFetch, with one draw per stored value), serve it past
// its TTL (see cache.WithStale), or count it a miss; and how long Redis
// must keep it past its TTL for that.
package freshness

import (
	"math"
	"time"

	"github.com/stampede-go/stampede/internal/record"
)

// Age is what a read value's freshness calls for.
type Age uint8

const (
	Fresh   Age = iota // serve it
	Refresh            // serve it and refresh it in the background
	Stale              // past its TTL: serve it as stale, refreshing it unless throttled
	Expired            // past every grace: a miss
)

// Policy is a Cache's early refresh and stale serving.
type Policy struct {
	Beta  float64       // XFetch's beta; 0: no early refresh
	Stale time.Duration // how long past its TTL a value may be served; 0: never
}

// Of classifies a record read at now. head is the record up to its
// payload, for the early-refresh draw; nil for a read that never refreshes.
func (p Policy) Of(f record.Freshness, throttled bool, now time.Time, head []byte) Age {
	if f.Expiry.IsZero() {
		return Fresh // written without metadata: Redis's expiry is its TTL
	}
	if now.Before(f.Expiry) {
		switch {
		case throttled:
			return Stale
		case p.Beta > 0 && head != nil && p.due(f, now, head):
			return Refresh
		}
		return Fresh
	}
	past := now.Sub(f.Expiry)
	switch {
	case past < p.Stale:
		return Stale
	case p.Beta > 0 && past < grace(f.Load):
		return Refresh // a refresh that is late; serve the value meanwhile
	}
	return Expired
}

// due reports whether a value is due for early refresh: when now is within
// load*max(1, beta*-ln(u)) of its expiry (XFetch, Vattani et al., with a
// floor of one load duration so that a refresh normally ends before the
// expiry, not in the grace after it).
//
// u is drawn once per stored value and is the same in every process (a
// hash of the record's head). The paper draws afresh on every read so that
// one reader among many goes first; here the load lock already lets only
// one refresh run, and fresh draws would only make it early (the earliest
// of many draws comes ln(reads) load durations sooner). One shared draw
// keeps the refresh's lead the same however many processes read the key,
// while still spreading the refreshes of values written together.
func (p Policy) due(f record.Freshness, now time.Time, head []byte) bool {
	left := f.Expiry.Sub(now)
	if left <= f.Load {
		return true
	}
	if float64(left) > 45*float64(f.Load)*p.Beta { // -ln(u) is at most 44.4 for u >= 2^-64: no need to draw
		return false
	}
	return Lead(p.Beta, f, head) >= left
}

// Lead is how long before its expiry a record is due for early refresh:
// load*max(1, beta*-ln(u)), u its draw (one load without a head).
func Lead(beta float64, f record.Freshness, head []byte) time.Duration {
	if head == nil {
		return f.Load
	}
	return time.Duration(float64(f.Load) * max(1, beta*-math.Log(draw(head))))
}

// draw returns the XFetch draw of the record whose header and metadata are
// head: uniform in (0, 1], the same in every process, and different for
// every write (the metadata holds the expiry to the millisecond and the
// load duration to the microsecond). FNV-1a, then murmur3's finalizer so
// that the high bits depend on every byte.
func draw(head []byte) float64 {
	h := uint64(14695981039346656037)
	for _, b := range head {
		h ^= uint64(b)
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return (float64(h>>11) + 1) / (1 << 53)
}

// grace is how long past its TTL a value stays readable so that a refresh
// that starts late is not seen as a miss: three load durations.
func grace(load time.Duration) time.Duration { return 3 * load }

// KeepPast is how long past its TTL Redis must keep a value loaded in load.
func (p Policy) KeepPast(load time.Duration) time.Duration {
	if p.Beta == 0 {
		return p.Stale
	}
	return max(p.Stale, grace(load))
}
