// health.go is what the caches on one client know of their Redis: where it
// is, for the messages that name it.

package cache

import (
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

// health is one client's state, shared by its caches and breakers. Safe
// for concurrent use.
type health struct {
	addr string // where the client points, for messages
}

// loggerRef is a Cache's logger setting (see WithLogger).
type loggerRef struct{}

func (h *health) register(loggerRef)   {}
func (h *health) unregister(loggerRef) {}

func (c *config) loggerRef() loggerRef { return loggerRef{} }

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
