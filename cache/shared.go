// This file holds what every Cache on one Redis client shares: the
// notifier (one subscription per master), the near caches' tracking
// connections (one per master, see coherence.Hub), the circuit breakers and
// the health state (see internal/health). Ten caches of different value types on
// one client thus hold at most two subscribed connections per master, and
// an outage that one of them meets opens the breaker of all of them at once.

package cache

import (
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/health"
	"github.com/stampede-go/stampede/internal/notify"
)

// clientRes is the resources of one client, kept while a Cache on it is
// open. Safe for concurrent use.
type clientRes struct {
	rdb    redis.UniversalClient
	notify *notify.Notifier // nil: waiters poll
	health *health.State
	refs   int  // Caches holding it; protected by registry.mu
	listed bool // in registry.m (a client that is a pointer)
	// claims is, per prefix, the value type of the open Caches on it and
	// their count; protected by registry.mu. Two value types on one prefix
	// would overwrite each other's values (see acquire).
	claims map[string]claim

	mu       sync.Mutex
	breakers map[breakerConfig]*health.Breaker // protected by mu
	hub      *coherence.Hub                    // the near caches' tracking connections; nil until one is made; protected by mu
}

// breakerConfig is what tells breakers apart on one client: caches with the
// same settings share one breaker, caches with other settings get their own
// (each opens after its own count of failures), all of them sharing the
// client's health state.
type breakerConfig struct {
	failures int
	coolDown time.Duration
}

// claim is the value type that the open Caches of one prefix hold.
type claim struct {
	vt reflect.Type
	n  int
}

// registry maps each client (by pointer) to its resources.
var registry struct {
	mu sync.Mutex
	m  map[redis.UniversalClient]*clientRes // protected by mu
}

// share is one Cache's hold on its client's resources; release gives it
// back, once.
type share struct {
	res      *clientRes
	brk      *health.Breaker
	notify   *notify.Notifier // res.notify for this Cache's prefix; nil: waiters poll
	prefix   string           // the claim held in res.claims
	claimed  bool             // a claim is held (a client that is a pointer)
	decodes  decodeReports    // undecodable records reported to this Cache's hook
	encodes  decodeReports    // keys whose values the codec could not encode, reported to the hook
	logger   health.Logger    // registered with res.health while held
	fullSeen atomic.Uint64    // the last memory-pressure episode this Cache's hook was told of
	unlisten func()           // stops this Cache hearing the breaker
	once     sync.Once
}

// acquire returns a hold on rdb's resources for a Cache of values of type
// vt, creating them for the first Cache on rdb. A client that is not a
// pointer (which cannot be told apart from a copy of itself) gets resources
// of its own. It panics if an open Cache on rdb with the same non-empty
// prefix holds another value type: each would read the other's values as
// undecodable and replace them, and the mix-up is a programming error best
// found at New. The empty prefix is left shared: without WithPrefix the
// keys carry their own namespaces ("user:1", "product:1"), a common and
// sound layout; a clash there is still reported (EventDecodeError).
func acquire(rdb redis.UniversalClient, cfg *config, vt reflect.Type) *share {
	var r *clientRes
	claimed := false
	if reflect.TypeOf(rdb).Kind() == reflect.Pointer {
		registry.mu.Lock()
		r = registry.m[rdb]
		if c, ok := r.claimOf(cfg.prefix); ok && c.vt != vt && cfg.prefix != "" {
			registry.mu.Unlock()
			panic(fmt.Sprintf("cache: New: a Cache[%v] with prefix %q is open on this client; a Cache[%v] there would overwrite its values (give it another prefix, or Close the other first)",
				c.vt, cfg.prefix, vt))
		}
		if r == nil {
			r = newClientRes(rdb)
			r.listed = true
			if registry.m == nil {
				registry.m = map[redis.UniversalClient]*clientRes{}
			}
			registry.m[rdb] = r
		}
		r.refs++
		if r.claims == nil {
			r.claims = map[string]claim{}
		}
		r.claims[cfg.prefix] = claim{vt: vt, n: r.claims[cfg.prefix].n + 1}
		claimed = true
		registry.mu.Unlock()
	} else {
		r = newClientRes(rdb)
		r.refs = 1
	}
	s := &share{res: r, brk: r.breaker(breakerConfig{cfg.breaker.failures, cfg.breaker.coolDown})}
	// A copy of what emit uses: the breaker outlives a Cache dropped without
	// Close, which must stay collectable (see New).
	hear := &config{observer: cfg.observer, onError: cfg.onError}
	s.unlisten = s.brk.Listen(func(open bool, key string, err error) {
		kind := EventBreakerClose
		if open {
			kind = EventBreakerOpen
		}
		hear.emit(kind, key, 0, err)
	})
	s.notify = r.notify.WithPrefix(cfg.prefix)
	s.prefix, s.claimed = cfg.prefix, claimed
	s.logger = health.Logger{L: cfg.logger, Off: cfg.logOff}
	r.health.Register(s.logger)
	r.health.WarnUnbounded(rdb)
	return s
}

// claimOf returns the claim on prefix. r may be nil. Called with
// registry.mu held.
func (r *clientRes) claimOf(prefix string) (claim, bool) {
	if r == nil {
		return claim{}, false
	}
	c, ok := r.claims[prefix]
	return c, ok
}

func newClientRes(rdb redis.UniversalClient) *clientRes {
	return &clientRes{rdb: rdb, notify: notify.New(rdb), health: health.New(rdb)}
}

// breaker returns the client's breaker for settings bc.
func (r *clientRes) breaker(bc breakerConfig) *health.Breaker {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.breakers[bc]
	if b == nil {
		b = health.NewBreaker(bc.failures, bc.coolDown, r.health, ErrCircuitOpen)
		if r.breakers == nil {
			r.breakers = map[breakerConfig]*health.Breaker{}
		}
		r.breakers[bc] = b
	}
	return b
}

// nearHub returns the client's tracking connections, made at the first
// near cache: a client whose Caches keep none opens none.
func (r *clientRes) nearHub() *coherence.Hub {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hub == nil {
		r.hub = coherence.NewHub(r.rdb)
	}
	return r.hub
}

// release gives the hold back; the last one on a client closes its
// notifier and its near caches' tracking connections (their subscriptions
// and goroutines) and forgets the client.
// Safe to call more than once, concurrently.
func (s *share) release() {
	s.once.Do(func() {
		r := s.res
		s.unlisten()
		r.health.Unregister(s.logger)
		registry.mu.Lock()
		r.refs--
		if s.claimed {
			if c := r.claims[s.prefix]; c.n > 1 {
				r.claims[s.prefix] = claim{vt: c.vt, n: c.n - 1}
			} else {
				delete(r.claims, s.prefix)
			}
		}
		last := r.refs == 0
		if last && r.listed {
			delete(registry.m, r.rdb)
		}
		registry.mu.Unlock()
		if last {
			r.notify.Close()
			r.mu.Lock()
			hub := r.hub
			r.mu.Unlock()
			if hub != nil {
				hub.Close()
			}
		}
	})
}

// decodeReportMax bounds the keys a decodeReports remembers.
const decodeReportMax = 1024

// decodeReports remembers the keys whose undecodable record a Cache's error
// hook was told of, so that a key read in a loop costs the hook one call,
// not one per read. Past decodeReportMax keys it forgets them all at once,
// which bounds its memory. Safe for concurrent use.
type decodeReports struct {
	mu   sync.Mutex
	keys map[string]struct{} // protected by mu
}

// first reports whether key is not remembered yet, and remembers it.
func (d *decodeReports) first(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.keys[key]; ok {
		return false
	}
	if d.keys == nil || len(d.keys) >= decodeReportMax {
		d.keys = map[string]struct{}{}
	}
	d.keys[key] = struct{}{}
	return true
}
