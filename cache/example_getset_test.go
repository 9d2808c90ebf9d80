// This file shows the direct access to the cache: Get, which
// reads without loading, and Set, the write-through after a change of the
// source. Like every example with an Output comment, they run in CI against
// the test Redis (REDIS_ADDR).

package cache_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/coherence"
)

// uniquePrefix is name followed by a random suffix and a colon: each run of
// an example writes keys of its own, so that runs sharing a Redis never
// meet. In production the prefix is fixed ("product:").
//
// A prefix in use has an older near-cache registry than a new one, whose
// first write waits out one lease (1 s) in case the registry was lost with
// leases running (see TestLostRegistryMakesWritesWaitOneLease). The
// examples would pay that second each, in series: the registry is dated an
// hour back, as a prefix in use for an hour would have it.
func uniquePrefix(name string) string {
	prefix := name + strconv.FormatUint(rand.Uint64(), 36) + ":"
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	if now, err := rdb.Time(ctx).Result(); err == nil {
		registry := coherence.RegistryKey(prefix)
		rdb.HSet(ctx, registry, "~since", now.Add(-time.Hour).UnixMilli())
		rdb.PExpire(ctx, registry, 10*time.Minute) // as a registry without leases
	}
	return prefix
}

// Get reads what the cache holds and never calls the database: for a
// page that shows a product only if it is cached, or for a check.
func ExampleCache_Get() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:get:product:")))
	defer products.Close()
	defer products.Delete(ctx, "42", "7")

	_, err := products.Get(ctx, "42")
	fmt.Println("before a load:", errors.Is(err, cache.ErrCacheMiss))

	for _, id := range []string{"42", "7"} {
		_, _ = products.GetOrLoad(ctx, id, func(ctx context.Context) (Product, error) {
			return findProduct(ctx, id)
		})
	}
	p, err := products.Get(ctx, "42")
	fmt.Println("after a load:", p.Name, err)
	_, err = products.Get(ctx, "7") // the loader's not-found is cached too
	fmt.Println("a cached not-found:", errors.Is(err, cache.ErrNotFound))
	// Output:
	// before a load: true
	// after a load: Espresso machine <nil>
	// a cached not-found: true
}

// Set writes a new value through after the database was updated. It wins
// over a load of the old value still in flight, here or in any other
// process: that load's lock is voided, so its commit writes nothing.
func ExampleCache_Set() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:set:product:")))
	defer products.Close()
	defer products.Delete(ctx, "42")

	// A reader loads product 42 and is slow: it read the old price.
	reading, readDone := make(chan struct{}), make(chan struct{})
	resume := make(chan struct{})
	go func() {
		defer close(readDone)
		_, _ = products.GetOrLoad(ctx, "42", func(context.Context) (Product, error) {
			close(reading)
			<-resume
			return Product{ID: "42", Name: "Espresso machine", Price: 19900}, nil
		})
	}()
	<-reading

	// Meanwhile a writer updates the database, then the cache.
	if err := products.Set(ctx, "42", Product{ID: "42", Name: "Espresso machine", Price: 17900}); err != nil {
		fmt.Println("set:", err)
		return
	}
	close(resume) // the slow reader returns the old price: it is not stored
	<-readDone

	p, err := products.Get(ctx, "42")
	fmt.Println(p.Price, err)
	// Output: 17900 <nil>
}
