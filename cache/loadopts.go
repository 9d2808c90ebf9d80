// This file lets a loader decide about the value it returns: how long it
// is good for, or that it must not be cached, without changing the loader's
// signature.

package cache

import (
	"context"
	"time"
)

// loadOptions is what a loader said through its context.
type loadOptions struct {
	ttl       ttlChoice // the call's, unless the loader chose
	tags      []string  // the call's, and the loader's (AddTags)
	noCache   bool
	tagging   bool // the Cache has WithTags: AddTags works
	single    bool // one key is loaded: SetVersion works
	version   int64
	versioned bool // SetVersion was called
}

// storeChoice is what one call chose for the values it stores.
type storeChoice struct {
	ttl       ttlChoice
	tags      []string // see Tags
	version   int64    // see Version
	versioned bool
}

// ttlChoice is the TTL one call or one load chose; unset, the Cache's.
type ttlChoice struct {
	d   time.Duration // at or below zero: the value is not stored
	set bool
}

// orDefault is the chosen TTL, else def.
func (t ttlChoice) orDefault(def time.Duration) time.Duration {
	if t.set {
		return t.d
	}
	return def
}

// loadOptionsKey is the context key of a loader's *loadOptions.
type loadOptionsKey struct{}

// SetTTL, called by a loader with the context it was given, sets the TTL of
// the value it is about to return, instead of the call's [TTL] or the
// Cache's (see [WithTTL]); jitter still applies, and refreshes of the
// value keep d, as they keep a [TTL]'s. As with [TTL], a d at or below
// zero means the value is returned but not stored (a TTL computed from
// data that has already run out: time.Until(sale.Ends)), and a d under 1ms
// is 1ms, Redis's resolution. It reports whether ctx is a
// loader's context: false for any other, the usual slip being the
// caller's ctx captured by the loader's closure instead of the one the
// loader receives. (It reports rather than panics: a loader shared with
// code outside the cache should not crash there.)
func SetTTL(ctx context.Context, d time.Duration) bool {
	if o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions); o != nil {
		o.ttl = ttlChoice{d, true}
		return true
	}
	return false
}

// AddTags, called by a loader with the context it was given, adds tags to
// the values it is about to return, besides the call's [Tags]: a product
// loader that learns the product's category, say. It reports whether ctx
// is a loader's context of a Cache made [WithTags]; on any other Cache's
// loader it returns false and keeps the values out of Redis (stored
// without the tag, a later [Cache.DeleteByTag] would miss them). Empty
// tags are ignored.
func AddTags(ctx context.Context, tags ...string) bool {
	o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions)
	switch {
	case o == nil:
		return false
	case !o.tagging:
		o.noCache = true
		return false
	}
	for _, t := range tags {
		if t != "" {
			o.tags = append(o.tags, t)
		}
	}
	return true
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

// SetVersion, called by a loader of one key with the context it was given,
// stores v, the source's version of the value it is about to return (the
// row's version, read with it), with the value, as [Version] does for
// [Cache.Set]: a later versioned Set older than v is then refused, even
// though the value came from a load. It reports whether ctx is the context
// of a loader of one key: false for any other, and for a
// [Cache.GetOrLoadMany] loader of several keys (one version cannot be every
// value's), whose values are stored without a version.
func SetVersion(ctx context.Context, v int64) bool {
	if o, _ := ctx.Value(loadOptionsKey{}).(*loadOptions); o != nil && o.single {
		o.version, o.versioned = v, true
		return true
	}
	return false
}
