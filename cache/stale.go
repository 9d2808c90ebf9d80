// This file judges a value read from Redis by its age (internal/freshness
// decides what the age calls for), and serves values past their TTL
// (stale-while-revalidate, stale-if-error) when WithStale allows.

package cache

import (
	"context"

	"github.com/stampede-go/stampede/internal/freshness"
)

// freshnessPolicy is the Cache's early refresh and stale serving, which judge what
// a read value's age calls for (see internal/freshness).
func (cfg *config) freshnessPolicy() freshness.Policy {
	return freshness.Policy{Beta: cfg.beta, Stale: cfg.stale}
}

// withFreshness reports whether records carry freshness metadata: only
// when something reads it.
func (cfg *config) withFreshness() bool { return cfg.beta > 0 || cfg.stale > 0 || cfg.near.enabled() }

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
