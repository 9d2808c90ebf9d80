// This file is what a flight hands its callers: a value read or loaded,
// or why there is none.

package cache

import (
	"sync/atomic"
	"time"

	"github.com/stampede-go/stampede/internal/record"
)

// result is what one flight hands to all of its callers.
type result[V any] struct {
	data      []byte           // the codec's bytes; each caller decodes its own copy
	notFound  error            // non-nil: the value does not exist; what callers get
	err       error            // non-nil: the codec panicked reading the record; what callers get
	v         V                // on a hit, data already decoded once...
	hasV      bool             // ...for the first caller to take
	taken     atomic.Bool      // whether v has been handed out
	freshness record.Freshness // what the record says of its age (zero: nothing)
	head      []byte           // the record up to the payload: which write it is
	throttled bool             // a stale value kept after a failed refresh
	expired   bool             // expired by hand (Expire): reloaded, kept as the fallback
	stamp     *record.Stamp    // the record's tags and tag clock (nil: none)
	stale     bool             // served past its TTL
	tracked   bool             // read where Redis reports its key's next write to this process (see near.keep)
	unencoded bool             // the codec could not encode v: not stored, and every caller gets v itself
	// quarantined: not the record read, which the codec could not decode,
	// but the value last loaded for the key (see quarantine).
	quarantined bool
	// at is when the Redis call that vouches for this result was sent: the
	// read that found it, the commit that stored it, or for a load whose lock
	// was lost, the lock's acquisition. A caller that began after at may
	// have begun after a Delete in another process removed it, so it asks
	// again rather than take it.
	at time.Time
}

// markTracked notes whether r was read where Redis reports its key's next
// write to this process; it returns r.
func markTracked[V any](r *result[V], tracked bool) *result[V] {
	if r != nil {
		r.tracked = tracked
	}
	return r
}
