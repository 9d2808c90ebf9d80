package health

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Addr names where rdb points: its address, a cluster's seed addresses or
// a ring's shards.
func Addr(rdb redis.UniversalClient) string {
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

// Ping checks that every node of rdb answers; its error names the address
// and, on a cluster or a ring, the node that failed.
func Ping(ctx context.Context, rdb redis.UniversalClient) error {
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
			return fmt.Errorf("cache: ping redis cluster at %s: %w", Addr(r), err)
		}
	case *redis.Ring:
		if err = r.ForEachShard(ctx, node); err != nil {
			return fmt.Errorf("cache: ping redis ring at %s: %w", Addr(r), err)
		}
	default:
		if err = rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("cache: ping redis at %s: %w", Addr(rdb), err)
		}
	}
	return nil
}
