// Package clock is the process's monotonic clock as nanoseconds from one
// epoch, which fits an atomic.Int64 (the breaker, lock renewals, near-cache
// expiries), and a deadline that many flights share instead of a timer
// each.
package clock

import "time"

// epoch anchors Now and At.
var epoch = time.Now()

// Now is the monotonic time, in nanoseconds since the epoch.
func Now() int64 { return int64(time.Since(epoch)) }

// At is t on the clock of Now (t must carry a monotonic reading, as
// time.Now's do).
func At(t time.Time) int64 { return int64(t.Sub(epoch)) }
