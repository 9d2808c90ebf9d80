// shared.go holds what every Cache on one Redis client shares: the
// notifier (one subscription per master), the circuit breakers and the
// health state (see health.go). Five caches of different value types on
// one client thus hold one subscribed connection per master, and an outage
// that one of them meets opens the breaker of all of them at once.

package cache

import (
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// clientRes is the resources of one client, kept while a Cache on it is
// open. Safe for concurrent use.
type clientRes struct {
	rdb    redis.UniversalClient
	notify *notifier // nil: waiters poll
	health health
	refs   int  // Caches holding it; protected by registry.mu
	listed bool // in registry.m (a client that is a pointer)

	mu       sync.Mutex
	breakers map[breakerConfig]*breaker // protected by mu
}

// breakerConfig is what tells breakers apart on one client: caches with the
// same settings share one breaker, caches with other settings get their own
// (each opens after its own count of failures), all of them sharing the
// client's health state.
type breakerConfig struct {
	failures int
	coolDown time.Duration
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
	brk      *breaker
	logger   loggerRef     // registered with res.health while held
	fullSeen atomic.Uint64 // the last memory-pressure episode this Cache's hook was told of
	once     sync.Once
}

// acquire returns a hold on rdb's resources, creating them for the first
// Cache on rdb. A client that is not a pointer (which cannot be told apart
// from a copy of itself) gets resources of its own.
func acquire(rdb redis.UniversalClient, cfg *config) *share {
	var r *clientRes
	if reflect.TypeOf(rdb).Kind() == reflect.Pointer {
		registry.mu.Lock()
		r = registry.m[rdb]
		if r == nil {
			r = newClientRes(rdb)
			r.listed = true
			if registry.m == nil {
				registry.m = map[redis.UniversalClient]*clientRes{}
			}
			registry.m[rdb] = r
		}
		r.refs++
		registry.mu.Unlock()
	} else {
		r = newClientRes(rdb)
		r.refs = 1
	}
	s := &share{res: r, brk: r.breaker(breakerConfig{cfg.breaker.failures, cfg.breaker.coolDown})}
	s.logger = cfg.loggerRef()
	r.health.register(s.logger)
	return s
}

func newClientRes(rdb redis.UniversalClient) *clientRes {
	r := &clientRes{rdb: rdb, notify: newNotifier(rdb)}
	r.health.addr = addrOf(rdb)
	return r
}

// breaker returns the client's breaker for settings bc.
func (r *clientRes) breaker(bc breakerConfig) *breaker {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.breakers[bc]
	if b == nil {
		b = &breaker{threshold: int32(bc.failures), coolDown: bc.coolDown, health: &r.health}
		if r.breakers == nil {
			r.breakers = map[breakerConfig]*breaker{}
		}
		r.breakers[bc] = b
	}
	return b
}

// release gives the hold back; the last one on a client closes its
// notifier (its subscriptions and their goroutines) and forgets the client.
// Safe to call more than once, concurrently.
func (s *share) release() {
	s.once.Do(func() {
		r := s.res
		r.health.unregister(s.logger)
		registry.mu.Lock()
		r.refs--
		last := r.refs == 0
		if last && r.listed {
			delete(registry.m, r.rdb)
		}
		registry.mu.Unlock()
		if last {
			r.notify.close()
		}
	})
}
