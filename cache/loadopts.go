// loadopts.go lets a loader decide about the value it returns: how long it
// is good for, or that it must not be cached, without changing the loader's
// signature.

package cache

import (
	"context"
	"time"
)

// loadOptions is what a loader said through its context.
type loadOptions struct {
	ttl     time.Duration // 0: the Cache's TTL
	noCache bool
}

// loadOptionsKey is the context key of a loader's *loadOptions.
type loadOptionsKey struct{}

// SetTTL, called by a loader with the context it was given, sets the TTL of
// the value it is about to return, instead of the call's [TTL] or the
// Cache's (see [WithTTL]); jitter still applies. It reports whether it did:
// false when d is under 1ms or ctx is not a loader's context, the usual
// slip being the caller's ctx captured by the loader's closure instead of
// the one the loader receives. (It reports rather than panics: a loader
// shared with code outside the cache should not crash there.)
func SetTTL(ctx context.Context, d time.Duration) bool {
	if o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions); o != nil && d >= time.Millisecond {
		o.ttl = d
		return true
	}
	return false
}

// DoNotCache, called by a loader with the context it was given, keeps the
// value it is about to return (or its [ErrNotFound]) out of Redis: the
// callers merged with this load get it, later ones load again. It reports
// whether ctx is a loader's context (see [SetTTL]); outside a loader it
// does nothing and returns false.
func DoNotCache(ctx context.Context) bool {
	if o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions); o != nil {
		o.noCache = true
		return true
	}
	return false
}
