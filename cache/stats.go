// stats.go counts what a Cache did, for Stats: one counter per event kind,
// striped so that concurrent near hits on several cores do not all add to
// one cache line.

package cache

import (
	"errors"
	"sync/atomic"
	"unsafe"
)

// Stats is a snapshot of what a Cache did since [New], in this process,
// as [Cache.Stats] returns it. Counts are of events (see [EventKind]): a
// batch's loader call is one load, a flight shared by many callers one
// Redis hit.
type Stats struct {
	NearHits    int64 // values served from this process's memory (EventNearHit)
	RedisHits   int64 // flights answered by a value read from Redis (EventHit)
	Misses      int64 // reads that found no usable value (EventMiss)
	Loads       int64 // loader calls (EventLoad)
	LoadErrors  int64 // loader calls that failed; a not-found is not a failure
	Waits       int64 // waits for another holder's load (EventWait)
	StaleServed int64 // values served past their TTL (EventStaleServed)
	Refreshes   int64 // background refreshes that ran (EventRefresh)
	LeaseWaits  int64 // writes that waited out a near cache's lease (EventNearLeaseWait)
	LoadsVoided int64 // loaded values a Delete or Set kept out of Redis (EventLoadVoided)
	BreakerOpen bool  // the circuit breaker keeps calls off Redis now
	NearEntries int64 // values in the near cache now (an estimate)
	NearBytes   int64 // their weight against the near cache's budget (updated in batches)
}

const (
	eventKinds = int(EventLoadVoided) + 1
	loadErrors = eventKinds // the counter after the kinds'
	stripes    = 16         // a power of two
)

// counters are a Cache's counts. Safe for concurrent use.
type counters struct {
	stripe [stripes]struct {
		n [eventKinds + 1]atomic.Int64
		_ [64]byte // keeps neighbouring stripes off one cache line
	}
}

// count counts an event of kind (err: its Err). The stripe is picked by
// the address of the caller's stack: goroutines have stacks of their own,
// so concurrent callers mostly add to different stripes, for the price of
// a shift where a random number would cost more than the add.
func (s *counters) count(kind EventKind, err error) {
	var here byte
	st := &s.stripe[(uintptr(unsafe.Pointer(&here))>>13)&(stripes-1)]
	st.n[kind].Add(1)
	if kind == EventLoad && err != nil && !errors.Is(err, ErrNotFound) {
		st.n[loadErrors].Add(1)
	}
}

// sum is the count of counter i.
func (s *counters) sum(i int) int64 {
	var n int64
	for j := range s.stripe {
		n += s.stripe[j].n[i].Load()
	}
	return n
}

// snapshot is the counts as Stats.
func (s *counters) snapshot() Stats {
	return Stats{
		NearHits: s.sum(int(EventNearHit)), RedisHits: s.sum(int(EventHit)), Misses: s.sum(int(EventMiss)),
		Loads: s.sum(int(EventLoad)), LoadErrors: s.sum(loadErrors), Waits: s.sum(int(EventWait)),
		StaleServed: s.sum(int(EventStaleServed)), Refreshes: s.sum(int(EventRefresh)),
		LeaseWaits: s.sum(int(EventNearLeaseWait)), LoadsVoided: s.sum(int(EventLoadVoided)),
	}
}
