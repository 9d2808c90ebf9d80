// stale.go decides how old a value read from Redis is, and serves values past
// their TTL (stale-while-revalidate, stale-if-error) when WithStale allows.

package cache

import (
	"context"
	"math"
	"time"

	"github.com/stampede-go/stampede/internal/record"
)

// age is what a read value's freshness calls for.
type age uint8

const (
	ageFresh   age = iota // serve it
	ageRefresh            // serve it and refresh it in the background
	ageStale              // past its TTL: serve it as stale, refreshing it unless throttled
	ageExpired            // past every grace: a miss
)

// ageOf classifies a record read at now. head is the record up to its
// payload, for the early-refresh draw; nil for a read that never refreshes.
func (c *config) ageOf(f record.Freshness, throttled bool, now time.Time, head []byte) age {
	if f.Expiry.IsZero() {
		return ageFresh // written without metadata: Redis's expiry is its TTL
	}
	if now.Before(f.Expiry) {
		switch {
		case throttled:
			return ageStale
		case c.beta > 0 && head != nil && c.xfetch(f, now, head):
			return ageRefresh
		}
		return ageFresh
	}
	past := now.Sub(f.Expiry)
	switch {
	case past < c.stale:
		return ageStale
	case c.beta > 0 && past < grace(f.Load):
		return ageRefresh // a refresh that is late; serve the value meanwhile
	}
	return ageExpired
}

// xfetch reports whether a value is due for early refresh: when now is
// within load*max(1, beta*-ln(u)) of its expiry (XFetch, Vattani et al.,
// with a floor of one load duration so that a refresh normally ends before
// the expiry, not in the grace after it).
//
// u is drawn once per stored value and is the same in every process (a hash
// of the record's head). The paper draws afresh on every read so that one
// reader among many goes first; here the load lock already lets only one
// refresh run, and fresh draws would only make it early: the earliest of
// many draws comes ln(reads)+0.6 load durations before expiry, which at a
// TTL of a dozen load durations meant 1.17 loads per TTL over 4 processes.
// One shared draw keeps the refresh's lead at about 1.4 load durations
// however many processes read the key, while still spreading the refreshes
// of values written together.
func (c *config) xfetch(f record.Freshness, now time.Time, head []byte) bool {
	left := f.Expiry.Sub(now)
	if left <= f.Load {
		return true
	}
	if float64(left) > 45*float64(f.Load)*c.beta { // -ln(u) is at most 44.4 for u >= 2^-64: no need to draw
		return false
	}
	return refreshLead(c.beta, f, head) >= left
}

// refreshLead is how long before its expiry a record is due for early
// refresh: load*max(1, beta*-ln(u)), u its draw (one load without a head).
func refreshLead(beta float64, f record.Freshness, head []byte) time.Duration {
	if head == nil {
		return f.Load
	}
	return time.Duration(float64(f.Load) * max(1, beta*-math.Log(drawFor(head))))
}

// drawFor returns the XFetch draw of the record whose header and metadata
// are head: uniform in (0, 1], the same in every process, and different
// for every write (the metadata holds the expiry to the millisecond and the
// load duration to the microsecond). FNV-1a, then murmur3's finalizer so
// that the high bits depend on every byte.
func drawFor(head []byte) float64 {
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

// keepPast is how long past its TTL Redis must keep a value loaded in load.
func (c *config) keepPast(load time.Duration) time.Duration {
	if c.beta == 0 {
		return c.stale
	}
	return max(c.stale, grace(load))
}

// withFreshness reports whether records carry freshness metadata: only
// when something reads it.
func (c *config) withFreshness() bool { return c.beta > 0 || c.stale > 0 || c.near.on() }

// ResultInfo tells a caller about the value [Cache.GetOrLoad] or [Cache.Get]
// returned; see [WithResultInfo].
type ResultInfo struct {
	// Stale is set to true when the value was past its TTL (see [WithStale]).
	Stale bool
}

type resultInfoKey struct{}

// WithResultInfo returns a context that makes [Cache.GetOrLoad] and
// [Cache.Get] fill info, for callers that want to tell a stale value from a
// fresh one. Use a new ResultInfo for each call: it is only ever set, never
// cleared.
func WithResultInfo(ctx context.Context, info *ResultInfo) context.Context {
	return context.WithValue(ctx, resultInfoKey{}, info)
}

// markStale records in ctx's ResultInfo, if any, that a stale value was
// returned. Only stale results pay for the context lookup.
func markStale(ctx context.Context) {
	if info, _ := ctx.Value(resultInfoKey{}).(*ResultInfo); info != nil {
		info.Stale = true
	}
}

// judge decides what a flight does with a record it read (nil: unreadable)
// by its age: a fresh value is a hit, one due for early refresh a hit with
// its refresh due, a stale one is served (unless noStale) with its refresh
// due, or without one while a failed refresh's throttle lasts. A nil hit
// is a miss.
func (c *Cache[V]) judge(key string, r *result[V], noStale bool) (hit *result[V], isDue bool) {
	if r == nil || r.err != nil {
		return r, false
	}
	if r.expired { // expired by hand (Expire): a miss, whatever the clocks say
		return nil, false
	}
	switch c.cfg.ageOf(r.fresh, r.throttled, r.at, r.head) { // r.at is a moment ago: no clock read on a hit
	case ageFresh:
	case ageRefresh:
		isDue = true
	case ageStale:
		if noStale {
			return nil, false // a miss for this flight: reloaded under the lock
		}
		r.stale = true
		if r.throttled && r.at.Before(r.fresh.Expiry) { // its refresh failed: retried once the throttle ends
			c.cfg.emit(EventStaleServed, key, 0, ErrRefreshFailed)
			return r, false
		}
		return r, true // EventStaleServed once it is known how (see refreshDue)
	default:
		return nil, false
	}
	c.cfg.emit(EventHit, key, 0, nil)
	return r, isDue
}
