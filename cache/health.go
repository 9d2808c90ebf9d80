// health.go is what the caches on one client know of their Redis: where it
// is, whether it is down (the first failure of an outage is logged, once,
// and so is its end) and whether it is out of memory (logged once per
// episode); and Ping, the readiness check that says what is wrong.

package cache

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/rediserr"
)

// health is one client's state, shared by its caches and breakers. Safe
// for concurrent use.
type health struct {
	addr    string        // where the client points, for messages
	down    atomic.Bool   // an outage is in progress: its first failure was logged
	fullAt  atomic.Int64  // nanotime of the last OOM reply; 0: none yet
	episode atomic.Uint64 // episodes of memory pressure begun (see full)

	mu      sync.Mutex
	loggers map[*slog.Logger]int // protected by mu; by Caches using each; nil: slog.Default()
}

// loggerRef is a Cache's logger setting (see WithLogger): l, or
// slog.Default() at the time of logging when l is nil, unless off.
type loggerRef struct {
	l   *slog.Logger
	off bool
}

func (c *config) loggerRef() loggerRef { return loggerRef{c.logger, c.logOff} }

func (h *health) register(r loggerRef) {
	if r.off {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loggers == nil {
		h.loggers = map[*slog.Logger]int{}
	}
	h.loggers[r.l]++
}

func (h *health) unregister(r loggerRef) {
	if r.off {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loggers[r.l]--; h.loggers[r.l] <= 0 {
		delete(h.loggers, r.l)
	}
}

// log writes one record to each logger of the client's caches: the same
// logger set on several caches writes it once.
func (h *health) log(level slog.Level, msg string, args ...any) {
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

// learn learns from a Redis call's outcome: the first failure without a
// reply begins an outage and is logged; the first reply after it ends the
// outage and is logged too. One atomic load on the way of every call.
func (h *health) learn(class errClass, err error) {
	if class == errFull {
		h.full(err)
	}
	if class == errOutage {
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

// fullQuiet is how long without an OOM reply ends an episode of memory
// pressure: the next OOM begins a new one, reported again.
var fullQuiet = time.Minute

// full notes an OOM reply: Redis is up and serves reads but refuses writes
// (maxmemory reached, nothing left to evict). Not an outage: the breaker
// stays closed and hits go on; misses load and return their values
// uncached. The first OOM of an episode is logged; each Cache's error hook
// is told once per episode (see Cache.report).
func (h *health) full(err error) {
	now := nanotime()
	if last := h.fullAt.Swap(now); last == 0 || now-last > int64(fullQuiet) {
		h.episode.Add(1)
		h.log(slog.LevelError, "cache: redis is out of memory (maxmemory): values are not being stored; reads go on, loaded values are returned uncached",
			"redis", h.addr, "err", err)
	}
}

// addrOf names where rdb points: its address, a cluster's seed addresses or
// a ring's shards.
func addrOf(rdb redis.UniversalClient) string {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		var addrs []string
		for _, a := range c.Options().Addrs {
			addrs = append(addrs, a)
		}
		sort.Strings(addrs)
		return strings.Join(addrs, ",")
	}
	return "?"
}

// ping is Ping on rdb.
func ping(ctx context.Context, rdb redis.UniversalClient) error {
	node := func(ctx context.Context, n *redis.Client) error {
		if err := n.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("node %s: %w", n.Options().Addr, err)
		}
		return nil
	}
	var err error
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		if err = r.ForEachShard(ctx, node); err != nil {
			return fmt.Errorf("cache: ping redis cluster at %s: %w", addrOf(r), err)
		}
	case *redis.Ring:
		if err = r.ForEachShard(ctx, node); err != nil {
			return fmt.Errorf("cache: ping redis ring at %s: %w", addrOf(r), err)
		}
	default:
		if err = rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("cache: ping redis at %s: %w", addrOf(rdb), err)
		}
	}
	return nil
}

var unsupported sync.Map // addresses of servers said to lack client-side caching

// nearRefused reports that a near cache cannot serve because Redis refused
// a command it needs (its tracker reports that once until it serves): for
// a server without client-side caching, which every Cache on every client
// of it meets alike, once per process and server, as a warning.
func (h *health) nearRefused(prefix string, err error) {
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
