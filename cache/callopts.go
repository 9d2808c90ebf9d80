// callopts.go holds the per-call options: what one call of GetOrLoad,
// GetOrLoadMany, Get or Set changes for itself, leaving the Cache's
// options (With...) as they are for every other call.

package cache

import (
	"fmt"
	"time"
)

// CallOption changes one call of [Cache.GetOrLoad], [Cache.GetOrLoadMany],
// [Cache.Get] or [Cache.Set]. Each option's doc says which calls it
// applies to; a call ignores the options that mean nothing to it (a TTL to
// Get, say). The simple call, with no option, is the Cache's behaviour.
//
// Callers of one key merged into one flight share its work: the options of
// the caller that started the flight decide it (its TTL, whether a stale
// value may be served), as its loader does. [ForceRefresh] is the
// exception: such a call never joins a flight.
type CallOption func(*callOptions)

// callOptions is what a call's options said; the zero value is the Cache's
// behaviour.
type callOptions struct {
	ttl     time.Duration // 0: the Cache's (see WithTTL)
	force   bool          // load anew even if a value is cached
	noStale bool          // a value past its TTL is a miss for this call
}

// TTL makes the value this call stores live for d (before jitter) instead
// of the Cache's TTL (see [WithTTL]): for [Cache.Set] the value it writes,
// for [Cache.GetOrLoad] and [Cache.GetOrLoadMany] the values their loader
// returns (a loader's own [SetTTL] still wins: it knows the value). A hit
// keeps the TTL it was stored with. d must be at least 1ms; a smaller d
// panics: it is a programming error.
func TTL(d time.Duration) CallOption {
	if d < time.Millisecond {
		panic(fmt.Sprintf("cache: TTL: %v is under the 1ms Redis can keep", d))
	}
	return func(o *callOptions) { o.ttl = d }
}

// ForceRefresh makes [Cache.GetOrLoad] load the key anew even if a value is
// cached, and store what it loads: after a change to the source that did
// not go through [Cache.Set], say. It still takes the key's load lock, so
// that callers forcing the same key in any number of processes load it
// once: a caller that finds the lock held waits for that load and returns
// its value, which began after the value it found. It never joins an
// in-process flight that began before it. GetOrLoadMany, Get and Set
// ignore it.
func ForceRefresh() CallOption { return func(o *callOptions) { o.force = true } }

// NoStale makes one call treat a value past its TTL as missing even under
// [WithStale]: [Cache.GetOrLoad] loads it (under the load lock, as a miss)
// instead of serving it, and [Cache.Get] returns [ErrCacheMiss]. For a
// caller that needs a value within its TTL, such as a read before a
// write. GetOrLoadMany and Set ignore it.
func NoStale() CallOption { return func(o *callOptions) { o.noStale = true } }

// parseCall applies opts to the Cache's behaviour.
func parseCall(opts []CallOption) callOptions {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
