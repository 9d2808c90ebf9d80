// breaker.go is the circuit breaker: after consecutive Redis outages the
// cache stops calling Redis for a cool-down, so that an outage costs a
// caller microseconds instead of the client's dial retries, then lets one
// call through to probe.

package cache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// breaker is safe for concurrent use. The zero value with threshold 0 never
// opens. Every Cache on one client with the same breaker settings shares
// one (see shared.go).
type breaker struct {
	threshold int32
	coolDown  time.Duration
	health    *health               // the client's; nil in tests that make a breaker alone
	fails     atomic.Int32          // consecutive outages
	until     atomic.Int64          // 0: closed; else the nanotime of the next probe
	why       atomic.Pointer[error] // what the calls it keeps from Redis get: set when it opens

	mu      sync.Mutex
	hearers map[*config]struct{} // the Caches it serves, told of every transition; protected by mu
}

// listen makes cfg hear the breaker's transitions (EventBreakerOpen,
// EventBreakerClose), whichever Cache's call caused them; stop undoes it.
func (b *breaker) listen(cfg *config) (stop func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hearers == nil {
		b.hearers = map[*config]struct{}{}
	}
	b.hearers[cfg] = struct{}{}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.hearers, cfg)
	}
}

// tell sends a transition to every Cache the breaker serves, once each.
func (b *breaker) tell(kind EventKind, key string, err error) {
	b.mu.Lock()
	hearers := make([]*config, 0, len(b.hearers))
	for cfg := range b.hearers {
		hearers = append(hearers, cfg)
	}
	b.mu.Unlock()
	for _, cfg := range hearers {
		cfg.emit(kind, key, 0, err)
	}
}

// allow reports whether a call may go to Redis: always while closed; once per
// cool-down while open (the probe).
func (b *breaker) allow() bool {
	u := b.until.Load()
	if u == 0 {
		return true
	}
	now := nanotime()
	return now >= u && b.until.CompareAndSwap(u, now+int64(b.coolDown))
}

// open reports whether the breaker is open, for callers that must not probe.
func (b *breaker) open() bool { return b.until.Load() != 0 }

// err is the error of a call the open breaker kept from Redis: it matches
// ErrCircuitOpen and names the address and the failure that opened it.
func (b *breaker) err() error {
	if e := b.why.Load(); e != nil {
		return *e
	}
	return ErrCircuitOpen
}

// record counts the outcome of a Redis call of key (err, of class c) and
// tells every Cache the breaker serves when it opens or closes with it.
func (b *breaker) record(key string, c errClass, err error) {
	switch b.count(c, err) {
	case +1:
		b.tell(EventBreakerOpen, key, err)
	case -1:
		b.tell(EventBreakerClose, key, nil)
	}
}

// count counts a Redis call's outcome (err, of class c); it reports
// whether the breaker opened (+1) or closed (-1) with it.
func (b *breaker) count(c errClass, err error) int {
	if b.health != nil {
		b.health.learn(c, err)
	}
	if b.threshold == 0 {
		return 0
	}
	if c != errOutage {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		if b.until.Load() != 0 && b.until.Swap(0) != 0 {
			return -1
		}
		return 0
	}
	if b.fails.Add(1) < b.threshold {
		return 0
	}
	addr := "?"
	if b.health != nil {
		addr = b.health.addr
	}
	why := fmt.Errorf("%w: redis at %s: %v", ErrCircuitOpen, addr, err) // before it opens: every call it keeps out gets it
	b.why.Store(&why)
	if b.until.Swap(nanotime()+int64(b.coolDown)) == 0 {
		return +1
	}
	return 0
}
