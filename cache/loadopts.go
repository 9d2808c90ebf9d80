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

type loadOptionsKey struct{}

// SetTTL, called by a loader with the context it was given, sets the TTL of
// the value it is about to return, instead of the Cache's (see [WithTTL]);
// jitter still applies. d must be at least 1ms; a smaller d, or a context
// that is not a loader's, makes SetTTL do nothing.
func SetTTL(ctx context.Context, d time.Duration) {
	if o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions); o != nil && d >= time.Millisecond {
		o.ttl = d
	}
}

// DoNotCache, called by a loader with the context it was given, keeps the
// value it is about to return (or its [ErrNotFound]) out of Redis: the
// callers merged with this load get it, later ones load again. Outside a
// loader it does nothing.
func DoNotCache(ctx context.Context) {
	if o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions); o != nil {
		o.noCache = true
	}
}
