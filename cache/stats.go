// This file counts what a Cache did, for Stats: one counter per event kind
// (see internal/striped).

package cache

import (
	"errors"

	"github.com/stampede-go/stampede/internal/striped"
)

// Stats is a snapshot of what a Cache did since [New], in this process,
// as [Cache.Stats] returns it. Counts are of events (see [EventKind]): a
// batch's loader call is one load, a flight shared by many callers one
// Redis hit.
type Stats struct {
	NearHits    int64 // values served from this process's memory (EventNearHit)
	RedisHits   int64 // flights and Get calls answered by a value read from Redis (EventHit)
	Misses      int64 // flights and Get calls that found no usable value (EventMiss)
	Loads       int64 // loader calls (EventLoad)
	LoadErrors  int64 // loader calls that failed; a not-found is not a failure
	Waits       int64 // waits for another holder's load (EventWait)
	StaleServed int64 // values served past their TTL (EventStaleServed)
	Refreshes   int64 // background refreshes that ran (EventRefresh)
	LeaseWaits  int64 // writes that waited out a near cache's lease (EventNearLeaseWait)
	LoadsVoided int64 // loaded values a Delete or Set kept out of Redis (EventLoadVoided)
	// DecodeErrors counts records the codec could not decode
	// (EventDecodeError): another value type or program writing the keys.
	DecodeErrors int64
	// EncodeErrors counts loaded values the codec could not encode
	// (EventEncodeError): returned to their callers, not stored.
	EncodeErrors int64
	// UncachedLoads counts keys loaded under FailOpen while Redis could not
	// serve them (EventUncachedLoad).
	UncachedLoads int64
	// NearEvictions counts values the near cache's byte budget pushed out
	// (EventNearEviction).
	NearEvictions int64
	// Writes counts writes of Redis with their confirmation (EventWrite):
	// Set, Delete, Expire, DeleteByTag, Clear.
	Writes int64
	// Quarantined counts flights answered with the value last loaded for a
	// key whose record could not be decoded, instead of a load
	// (EventQuarantined).
	Quarantined int64
	BreakerOpen bool  // the circuit breaker keeps calls off Redis now
	NearEntries int64 // values in the near cache now (an estimate)
	NearBytes   int64 // their weight against the near cache's budget (updated in batches)
}

const (
	eventKinds = int(EventQuarantined) + 1
	loadErrors = 0 // the counter no kind has (kinds start at 1)
)

var _ [striped.Size - eventKinds]struct{} // every count fits

// counters are a Cache's counts: one per event kind, and the load errors.
type counters struct{ striped.Counters }

// count counts an event of kind (err: its Err).
func (s *counters) count(kind EventKind, err error) {
	s.Add(int(kind))
	if kind == EventLoad && err != nil && !errors.Is(err, ErrNotFound) {
		s.Add(loadErrors)
	}
}

// snapshot is the counts as Stats.
func (s *counters) snapshot() Stats {
	return Stats{
		NearHits: s.Sum(int(EventNearHit)), RedisHits: s.Sum(int(EventHit)), Misses: s.Sum(int(EventMiss)),
		Loads: s.Sum(int(EventLoad)), LoadErrors: s.Sum(loadErrors), Waits: s.Sum(int(EventWait)),
		StaleServed: s.Sum(int(EventStaleServed)), Refreshes: s.Sum(int(EventRefresh)),
		LeaseWaits: s.Sum(int(EventNearLeaseWait)), LoadsVoided: s.Sum(int(EventLoadVoided)),
		DecodeErrors: s.Sum(int(EventDecodeError)), EncodeErrors: s.Sum(int(EventEncodeError)),
		UncachedLoads: s.Sum(int(EventUncachedLoad)), NearEvictions: s.Sum(int(EventNearEviction)),
		Writes: s.Sum(int(EventWrite)), Quarantined: s.Sum(int(EventQuarantined)),
	}
}
