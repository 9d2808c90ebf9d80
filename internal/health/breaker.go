package health

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/rediserr"
)

// Breaker is the circuit breaker: after consecutive Redis outages it keeps
// calls off Redis for a cool-down, so that an outage costs a caller
// microseconds instead of the client's dial retries, then lets one call
// through to probe. Make it with NewBreaker; safe for concurrent use.
type Breaker struct {
	threshold int32 // 0: never opens
	coolDown  time.Duration
	health    *State
	errOpen   error                 // what the calls it keeps get, wrapped once it knows why
	fails     atomic.Int32          // consecutive outages
	until     atomic.Int64          // 0: closed; else the clock.Now of the next probe
	why       atomic.Pointer[error] // set when it opens

	mu      sync.Mutex
	hearers map[*Hearer]struct{} // protected by mu
}

// Hearer is told of a breaker's transitions: open (with the failure that
// opened it) or closed, and the key of the call that caused it.
type Hearer func(open bool, key string, err error)

// NewBreaker returns a breaker that opens after failures consecutive
// outages (0: never) for coolDown, learning every outcome into h. The
// calls it keeps from Redis get an error matching errOpen.
func NewBreaker(failures int, coolDown time.Duration, h *State, errOpen error) *Breaker {
	return &Breaker{threshold: int32(failures), coolDown: coolDown, health: h, errOpen: errOpen}
}

// Listen makes fn hear the breaker's transitions, whichever caller caused
// them; stop undoes it.
func (b *Breaker) Listen(fn Hearer) (stop func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hearers == nil {
		b.hearers = map[*Hearer]struct{}{}
	}
	h := &fn
	b.hearers[h] = struct{}{}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.hearers, h)
	}
}

// tell sends a transition to every hearer, once each.
func (b *Breaker) tell(open bool, key string, err error) {
	b.mu.Lock()
	hearers := make([]Hearer, 0, len(b.hearers))
	for h := range b.hearers {
		hearers = append(hearers, *h)
	}
	b.mu.Unlock()
	for _, h := range hearers {
		h(open, key, err)
	}
}

// Allow reports whether a call may go to Redis: always while closed; once
// per cool-down while open (the probe).
func (b *Breaker) Allow() bool {
	u := b.until.Load()
	if u == 0 {
		return true
	}
	now := clock.Now()
	return now >= u && b.until.CompareAndSwap(u, now+int64(b.coolDown))
}

// Open reports whether the breaker is open, for callers that must not probe.
func (b *Breaker) Open() bool { return b.until.Load() != 0 }

// Err is the error of a call the open breaker kept from Redis: it matches
// errOpen and names the address and the failure that opened it.
func (b *Breaker) Err() error {
	if e := b.why.Load(); e != nil {
		return *e
	}
	return b.errOpen
}

// Record counts the outcome of a Redis call of key (err, of class c) and
// tells the hearers when the breaker opens or closes with it. A call on a
// client the program closed never reached Redis: it is not counted, nor
// learnt (it is no outage, nor a reply that ends one).
func (b *Breaker) Record(key string, c rediserr.Class, err error) {
	if rediserr.IsClosed(err) {
		return
	}
	switch b.count(c, err) {
	case +1:
		b.tell(true, key, err)
	case -1:
		b.tell(false, key, nil)
	}
}

// count counts a Redis call's outcome (err, of class c); it reports
// whether the breaker opened (+1) or closed (-1) with it.
func (b *Breaker) count(c rediserr.Class, err error) int {
	b.health.Learn(c, err)
	if b.threshold == 0 {
		return 0
	}
	if c != rediserr.Outage {
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
	why := fmt.Errorf("%w: redis at %s: %v", b.errOpen, b.health.addr, err) // before it opens: every call it keeps out gets it
	b.why.Store(&why)
	if b.until.Swap(clock.Now()+int64(b.coolDown)) == 0 {
		return +1
	}
	return 0
}
