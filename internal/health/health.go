// Package health is what the caches on one Redis client know of their
// Redis and do about it: where it is, whether it is down or out of memory
// (each logged once per episode, through the loggers of the client's
// caches), the circuit breakers that keep calls off it while it is down,
// and the readiness check that says what is wrong.
package health

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/rediserr"
)

// State is one client's health, shared by its caches and breakers. Make it
// with New; safe for concurrent use.
type State struct {
	addr    string        // where the client points, for messages
	down    atomic.Bool   // an outage is in progress: its first failure was logged
	fullAt  atomic.Int64  // clock.Now of the last OOM reply; 0: none yet
	episode atomic.Uint64 // episodes of memory pressure begun (see full)
	warned  atomic.Bool   // the client was said to be unbounded (see WarnUnbounded)

	mu      sync.Mutex
	loggers map[*slog.Logger]int // by the caches using each; nil: slog.Default(); protected by mu
}

// New returns the health of rdb.
func New(rdb redis.UniversalClient) *State { return &State{addr: Addr(rdb)} }

// Addr is where the client points: its address, a cluster's seeds or a
// ring's shards.
func (h *State) Addr() string { return h.addr }

// Logger is a cache's logger setting: L, or slog.Default() at the time of
// logging when L is nil, unless Off.
type Logger struct {
	L   *slog.Logger
	Off bool
}

// Register adds a cache's logger to those the client's events are logged
// to; Unregister takes it back.
func (h *State) Register(l Logger) {
	if l.Off {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loggers == nil {
		h.loggers = map[*slog.Logger]int{}
	}
	h.loggers[l.L]++
}

// Unregister undoes a Register of l.
func (h *State) Unregister(l Logger) {
	if l.Off {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loggers[l.L]--; h.loggers[l.L] <= 0 {
		delete(h.loggers, l.L)
	}
}

// log writes one record to each logger of the client's caches: the same
// logger set on several caches writes it once.
func (h *State) log(level slog.Level, msg string, args ...any) {
	h.mu.Lock()
	ls := make([]*slog.Logger, 0, len(h.loggers))
	for l := range h.loggers {
		if l == nil {
			l = slog.Default()
		}
		ls = append(ls, l)
	}
	h.mu.Unlock()
	for _, l := range ls {
		l.Log(context.Background(), level, msg, args...)
	}
}

// Learn learns from a Redis call's outcome: the first failure without a
// reply begins an outage and is logged; the first reply after it ends the
// outage and is logged too. One atomic load on the way of every call.
func (h *State) Learn(class rediserr.Class, err error) {
	if class == rediserr.Full {
		h.full(err)
	}
	if class == rediserr.Outage {
		if !h.down.Load() && h.down.CompareAndSwap(false, true) {
			h.log(slog.LevelError, "cache: redis unreachable; calls go on without it (FailOpen loads uncached, FailClosed fails) until it answers",
				"redis", h.addr, "err", err)
		}
		return
	}
	if h.down.Load() && h.down.CompareAndSwap(true, false) {
		h.log(slog.LevelInfo, "cache: redis answers again", "redis", h.addr)
	}
}

// FullQuiet is how long without an OOM reply ends an episode of memory
// pressure: the next OOM begins a new one, reported again. A variable for
// tests.
var FullQuiet = time.Minute

// full notes an OOM reply: Redis is up and serves reads but refuses writes
// (maxmemory reached, nothing left to evict). Not an outage: the breaker
// stays closed. The first OOM of an episode is logged; Episode tells the
// caches when a new one begins, for their error hooks.
func (h *State) full(err error) {
	now := clock.Now()
	if last := h.fullAt.Swap(now); last == 0 || now-last > int64(FullQuiet) {
		h.episode.Add(1)
		h.log(slog.LevelError, "cache: redis is out of memory (maxmemory): values are not being stored; reads go on, loaded values are returned uncached",
			"redis", h.addr, "err", err)
	}
}

// Episode is the number of episodes of memory pressure begun so far.
func (h *State) Episode() uint64 { return h.episode.Load() }

var unsupported sync.Map // addresses of servers said to lack client-side caching

// NearRefused reports that a near cache of prefix cannot serve because
// Redis refused a command it needs: for a server without client-side
// caching, which every cache on every client of it meets alike, once per
// process and server, as a warning; otherwise as an error.
func (h *State) NearRefused(prefix string, err error) {
	if rediserr.IsClosed(err) { // the program closed the client: not Redis refusing, and the calls return it
		return
	}
	if rediserr.IsUnknownCommand(err) {
		if _, seen := unsupported.LoadOrStore(h.addr, true); !seen {
			h.log(slog.LevelWarn, "cache: near cache off: this Redis server has no client-side caching (CLIENT TRACKING, Redis 6.0 or later); reads go to Redis",
				"redis", h.addr, "err", err)
		}
		return
	}
	h.log(slog.LevelError, "cache: near cache not serving: Redis refused a command it needs (see docs/GUARANTEES.md, Redis ACLs); reads go to Redis",
		"redis", h.addr, "prefix", prefix, "err", err)
}

// NearPerKeyEvicts reports that the server at addr may evict keys
// (maxmemory set, with policy) under a prefix whose near cache holds per
// key: an evicted holders record makes a write of its key wait for none of
// the processes that hold it.
func (h *State) NearPerKeyEvicts(prefix, addr, policy string) {
	h.log(slog.LevelWarn, "cache: near cache: WithNearPerKey on a Redis that evicts keys (maxmemory-policy "+policy+
		"): a write of a key whose holders record Redis evicted waits for none of the processes that hold it, which may serve the old value until its invalidation arrives (see docs/GUARANTEES.md); use noeviction, or a strict near cache without WithNearPerKey",
		"redis", addr, "prefix", prefix)
}

// NearNarrow reports that an ACL refused the near caches' lease registry of
// prefix (a rule granting the prefix alone, as versions before 0.4
// needed): the near cache works with the registry under the prefix, whose
// every renewal Redis reports to every process of the prefix.
func (h *State) NearNarrow(prefix string, err error) {
	h.log(slog.LevelWarn, "cache: near cache: Redis refused the lease registry ~{*}:stampede:near:"+prefix+
		" (or, with WithNearPerKey, ~{*}:stampede:hold:"+prefix+"); using the one under the prefix, which costs Redis more as processes grow (see docs/GUARANTEES.md, Redis ACLs)",
		"redis", h.addr, "prefix", prefix, "err", err)
}

// NearWiden reports that the registry NearNarrow reported refused is
// granted now (the ACL was fixed): the near cache uses it again.
func (h *State) NearWiden(prefix string) {
	h.log(slog.LevelInfo, "cache: near cache: Redis grants the lease registry ~{*}:stampede:near:"+prefix+" now; using it",
		"redis", h.addr, "prefix", prefix)
}
