// What per-key tracking costs Redis's memory: each (key, process) pair an
// eventual near cache read is an entry of Redis's tracking table until the
// key is written, evicted from the table, or the process goes; a per-key
// holder's (WithNearPerKey) is also a field of the key's holders hash.
package reliability_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
)

// BenchmarkTrackingMemory reads trackedKeys keys through the near caches of
// 1 and 4 Caches (each on a client of its own, as 4 processes), eventual or
// strict per key, and reports Redis's used_memory growth per tracked (key,
// process) pair, from INFO memory and INFO stats' tracking_total_items, on
// a private redis-server:
//
//	go test -run '^$' -bench BenchmarkTrackingMemory -benchtime 1x ./reliability/
func BenchmarkTrackingMemory(b *testing.B) {
	for _, near := range []string{"eventual", "perkey"} {
		for _, procs := range []int{1, 4} {
			b.Run("near="+near+"/procs="+strconv.Itoa(procs), func(b *testing.B) {
				for range b.N {
					benchTrackingMemory(b, near, procs)
				}
			})
		}
	}
}

const trackedKeys = 100_000

func benchTrackingMemory(b *testing.B, near string, procs int) {
	addr := privateRedis(b)
	direct := newClient(b, addr, nil)
	ctx := context.Background()
	p := "mem:"
	w := cache.New[string](newClient(b, addr, nil), cache.WithPrefix(p), cache.WithoutNearCache())
	defer w.Close()
	pipe := direct.Pipeline()
	for i := range trackedKeys {
		pipe.Set(ctx, p+"k"+strconv.Itoa(i), "v", 0) // raw strings: read as values the codec refuses, tracked all the same
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	before := infoInt(b, direct, "memory", "used_memory")
	for range procs {
		c := cache.New[string](newClient(b, addr, nil), nearOption(near, cache.WithPrefix(p))...)
		defer c.Close()
		for i := range trackedKeys {
			_, _ = c.Get(ctx, "k"+strconv.Itoa(i))
		}
	}
	items := infoInt(b, direct, "stats", "tracking_total_items")
	if items < int64(procs*trackedKeys/2) {
		b.Fatalf("%d tracked pairs after %d processes read %d keys: the reads were not tracked", items, procs, trackedKeys)
	}
	grown := infoInt(b, direct, "memory", "used_memory") - before
	b.ReportMetric(float64(grown)/float64(items), "redis-bytes/pair")
	b.ReportMetric(float64(items), "pairs")
}

// infoInt reads one integer field of an INFO section.
func infoInt(b *testing.B, rdb *redis.Client, section, field string) int64 {
	info, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("INFO %s has no %s", section, field)
	return 0
}
