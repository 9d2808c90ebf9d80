// This file shows a loader deciding about the value it
// returns: its TTL (SetTTL) or that it must not be cached (DoNotCache).

package cache_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

// The source says how long its answer is good for (an HTTP response's
// max-age, a price valid until the end of a sale): the loader passes it on
// with SetTTL, called with the context the loader was given.
func ExampleSetTTL() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	prefix := uniquePrefix("example:setttl:rate:")
	rates := cache.New[float64](rdb,
		cache.WithPrefix(prefix),
		cache.WithTTL(time.Hour),
		cache.WithoutJitter(), // for the exact TTL printed below; keep the jitter in production
	)
	defer rates.Close()
	defer rates.Delete(ctx, "EUR-USD")

	rate, err := rates.GetOrLoad(ctx, "EUR-USD", func(ctx context.Context) (float64, error) {
		// The rates service answered with "Cache-Control: max-age=30".
		cache.SetTTL(ctx, 30*time.Second)
		return 1.08, nil
	})
	fmt.Println(rate, err)
	fmt.Println("cached for", rdb.TTL(ctx, prefix+"EUR-USD").Val())
	// Output:
	// 1.08 <nil>
	// cached for 30s
}

// A loader that could only build a degraded answer (here a fallback served
// while the recommendation service is down) returns it to the callers
// without caching it, so that the next call tries the service again.
func ExampleDoNotCache() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	recs := cache.New[[]string](rdb, cache.WithPrefix(uniquePrefix("example:donotcache:recs:")))
	defer recs.Close()
	defer recs.Delete(ctx, "user-7")

	serviceUp := false
	calls := 0
	load := func(ctx context.Context) ([]string, error) {
		calls++
		if !serviceUp {
			cache.DoNotCache(ctx)
			return []string{"bestsellers"}, nil
		}
		return []string{"grinder", "kettle"}, nil
	}
	for range 2 {
		r, _ := recs.GetOrLoad(ctx, "user-7", load)
		fmt.Println(r)
	}
	serviceUp = true
	for range 2 {
		r, _ := recs.GetOrLoad(ctx, "user-7", load)
		fmt.Println(r)
	}
	fmt.Println("loader calls:", calls)
	// Output:
	// [bestsellers]
	// [bestsellers]
	// [grinder kettle]
	// [grinder kettle]
	// loader calls: 3
}
