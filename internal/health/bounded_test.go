package health

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestUnboundedEveryClientKind(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(bounded bool) redis.UniversalClient
	}{
		{"client", func(b bool) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: b})
		}},
		{"cluster", func(b bool) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: b})
		}},
		{"ring", func(b bool) redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: b})
		}},
		{"failover", func(b bool) redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: b})
		}},
		{"failover cluster", func(b bool) redis.UniversalClient {
			return redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: b})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, bounded := range []bool{false, true} {
				rdb := tc.new(bounded)
				options, unbounded := Unbounded(rdb)
				_ = rdb.Close()
				if unbounded == bounded {
					t.Errorf("ContextTimeoutEnabled %v: unbounded %v", bounded, unbounded)
				}
				if options == "" {
					t.Error("no options named")
				}
			}
		})
	}
}
