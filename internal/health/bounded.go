package health

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// Unbounded reports whether rdb's calls outlive the deadlines of their
// contexts (go-redis's ContextTimeoutEnabled off, its default), and names
// the options type to change. A hung Redis (frozen, or cut off without a
// reset) then holds every call for the client's read timeout, past any
// load timeout, so that FailOpen never gets to load. A client of an
// unknown kind is not judged.
func Unbounded(rdb redis.UniversalClient) (options string, unbounded bool) {
	switch r := rdb.(type) {
	case *redis.Client: // NewFailoverClient's too
		return "redis.Options (or redis.FailoverOptions)", !r.Options().ContextTimeoutEnabled
	case *redis.ClusterClient: // NewFailoverClusterClient's too
		return "redis.ClusterOptions (or redis.FailoverOptions)", !r.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return "redis.RingOptions", !r.Options().ContextTimeoutEnabled
	}
	return "", false
}

// WarnUnbounded warns, once per client and through the loggers of its
// caches, when rdb is Unbounded, naming the options to set.
func (h *State) WarnUnbounded(rdb redis.UniversalClient) {
	options, unbounded := Unbounded(rdb)
	if !unbounded || h.warned.Load() || !h.warned.CompareAndSwap(false, true) {
		return
	}
	h.log(slog.LevelWarn, "cache: the Redis client does not bound its calls by their context's deadline, so a hung Redis (frozen, or cut off without a reset) "+
		"holds every call for the client's read timeout, past the load timeout, and FailOpen never loads; "+
		"set ContextTimeoutEnabled: true, with ReadTimeout and WriteTimeout of about 100ms, in its "+options,
		"redis", h.addr)
}
