// This file shows the near cache: hot values served from process
// memory, dropped when their key is written anywhere.

package cache_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

// With a near cache, hits of hot keys are served from this process's
// memory, with no Redis round trip. Redis reports every write of a key
// under the prefix (client-side caching), so the value is dropped from
// memory in every process when anything changes or deletes it; this
// process's own Delete and Set drop it before they return.
func ExampleWithNearCache() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	var fromMemory atomic.Int64
	products := cache.New[Product](rdb,
		cache.WithPrefix(uniquePrefix("example:near:product:")), // only keys under it are reported
		cache.WithNearCache(64<<20),                             // at most 64 MiB of values in memory
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				fromMemory.Add(1)
			}
		}),
	)
	defer products.Close()
	defer products.Delete(ctx, "42")

	price := 19900 // stands in for the database
	loads := 0
	load := func(context.Context) (Product, error) {
		loads++
		return Product{ID: "42", Name: "Espresso machine", Price: price}, nil
	}
	// Memory serves once the process receives Redis's invalidations, a
	// moment after New; until then reads go to Redis.
	deadline := time.Now().Add(10 * time.Second)
	for fromMemory.Load() == 0 && time.Now().Before(deadline) {
		_, _ = products.GetOrLoad(ctx, "42", load)
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("served from memory:", fromMemory.Load() > 0)

	price = 17900
	if err := products.Delete(ctx, "42"); err != nil {
		fmt.Println("delete:", err)
		return
	}
	p, _ := products.GetOrLoad(ctx, "42", load)
	fmt.Println("after Delete:", p.Price)
	fmt.Println("loads:", loads)
	// Output:
	// served from memory: true
	// after Delete: 17900
	// loads: 2
}
