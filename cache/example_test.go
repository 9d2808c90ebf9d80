// This file shows the package's use as users copy it: reading through
// the cache, options, Delete after a write, the error hook with log/slog,
// FailClosed, a Redis Cluster client. Every example runs in CI, its Output
// checked, against the test Redis, whose address TestMain puts in
// REDIS_ADDR; the other example_*_test.go files cover the other everyday
// tasks. The standalone lock's examples are in package lock; a msgpack
// codec is in examples/msgpack (its own module, to keep msgpack out of
// go.sum).

package cache_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

type Product struct {
	ID    string
	Name  string
	Price int
}

// findProduct stands in for a database query.
func findProduct(_ context.Context, id string) (Product, error) {
	if id != "42" {
		return Product{}, cache.ErrNotFound
	}
	return Product{ID: "42", Name: "Espresso machine", Price: 19900}, nil
}

func Example() {
	ctx := context.Background()
	// Calls bounded by the cache's deadlines and short timeouts: a hung
	// Redis costs a call 100ms, and FailOpen loads meanwhile (New warns
	// about a client without ContextTimeoutEnabled).
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()

	products := cache.New[Product](rdb, cache.WithPrefix("example:product:"), cache.WithTTL(10*time.Minute))
	defer products.Close() // ends its background work (subscriptions, refreshes)
	defer products.Delete(ctx, "42")

	queries := 0
	load := func(ctx context.Context) (Product, error) {
		queries++
		return findProduct(ctx, "42")
	}
	for range 3 {
		p, err := products.GetOrLoad(ctx, "42", load)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Println(p.Name, p.Price)
	}
	fmt.Println("database queries:", queries)
	// Output:
	// Espresso machine 19900
	// Espresso machine 19900
	// Espresso machine 19900
	// database queries: 1
}

func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()

	// Product 42 is cached at "example:new:product:42" for 10 minutes, and a
	// product that does not exist is remembered for 30 seconds, so a burst
	// of requests for a bad ID does not reach the database either.
	// WithoutJitter makes the printed TTLs exact; keep the default ±10% in
	// production, so that values loaded together do not expire together.
	products := cache.New[Product](rdb,
		cache.WithPrefix("example:new:product:"),
		cache.WithTTL(10*time.Minute),
		cache.WithNotFoundTTL(30*time.Second),
		cache.WithoutJitter(),
	)
	defer products.Close()
	defer products.Delete(ctx, "42", "7")

	for _, id := range []string{"42", "7"} {
		_, err := products.GetOrLoad(ctx, id, func(ctx context.Context) (Product, error) {
			return findProduct(ctx, id)
		})
		found := "found"
		if errors.Is(err, cache.ErrNotFound) {
			found = "not found"
		}
		fmt.Printf("%s: %s, cached for %v\n", id, found, rdb.TTL(ctx, "example:new:product:"+id).Val())
	}
	// Output:
	// 42: found, cached for 10m0s
	// 7: not found, cached for 30s
}

func ExampleCache_GetOrLoad() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix("example:product:"))
	defer products.Close()
	defer products.Delete(ctx, "7")

	// The loader's ErrNotFound is cached too, so a missing ID does not reach
	// the database on every request.
	_, err := products.GetOrLoad(ctx, "7", func(ctx context.Context) (Product, error) {
		return findProduct(ctx, "7")
	})
	switch {
	case errors.Is(err, cache.ErrNotFound):
		fmt.Println("no such product")
	case errors.Is(err, cache.ErrLockNotAcquired):
		fmt.Println("another instance is still loading it; try again")
	case err != nil:
		fmt.Println("error:", err)
	}
	// Output: no such product
}

func ExampleCache_Delete() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix("example:delete:product:"))
	defer products.Close()
	defer products.Delete(ctx, "42")

	price := 19900 // stands in for the database
	load := func(context.Context) (Product, error) {
		return Product{ID: "42", Name: "Espresso machine", Price: price}, nil
	}
	p, _ := products.GetOrLoad(ctx, "42", load)
	fmt.Println("before:", p.Price)

	// A write: update the database first, then delete the cached copy. Every
	// instance's next read loads the new price, and a load of the old price
	// still in flight elsewhere cannot store it any more.
	price = 17900
	if err := products.Delete(ctx, "42"); err != nil {
		fmt.Println("delete:", err) // retry, or the old price stays until its TTL ends
		return
	}
	p, _ = products.GetOrLoad(ctx, "42", load)
	fmt.Println("after:", p.Price)
	// Output:
	// before: 19900
	// after: 17900
}

func ExampleWithErrorHook() {
	ctx := context.Background()
	// Redis is down: nothing listens on this port.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	defer rdb.Close()

	// Under the default FailOpen policy callers still get the database's
	// value (uncached, one load per key per process at a time); the hook is
	// where the Redis error shows up. It may be called from several
	// goroutines at once.
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var logged atomic.Int64
	products := cache.New[Product](rdb,
		cache.WithErrorHook(func(key string, err error) {
			logged.Add(1)
			logger.Warn("product cache", "key", key, "err", err)
		}),
	)
	defer products.Close()

	p, err := products.GetOrLoad(ctx, "42", func(ctx context.Context) (Product, error) {
		return findProduct(ctx, "42")
	})
	fmt.Println(p.Name, err)
	fmt.Println("errors logged:", logged.Load() > 0)
	// Output:
	// Espresso machine <nil>
	// errors logged: true
}

func ExampleWithFailurePolicy() {
	ctx := context.Background()
	// Redis is down: nothing listens on this port.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	defer rdb.Close()

	// When an unprotected load would hurt more than an error (a report that
	// costs minutes of database time, a rate-limited API), FailClosed returns
	// the Redis error instead of loading without the lock.
	reports := cache.New[string](rdb, cache.WithFailurePolicy(cache.FailClosed))
	defer reports.Close()
	var loads atomic.Int64
	_, err := reports.GetOrLoad(ctx, "report:2026-10", func(context.Context) (string, error) {
		loads.Add(1)
		return "...", nil
	})
	fmt.Println("error:", err != nil)
	fmt.Println("loads:", loads.Load())
	// Output:
	// error: true
	// loads: 0
}

// A Redis Cluster client needs nothing more: each key's load lock lives in
// the key's own hash slot, so the cache's scripts run on the node that owns
// the key, and Delete and the batched reads go to each key's master.
//
// In production the client only needs seed addresses:
//
//	rdb := redis.NewClusterClient(&redis.ClusterOptions{
//		Addrs:                 []string{"redis-0:6379", "redis-1:6379", "redis-2:6379"},
//		ContextTimeoutEnabled: true,
//		ReadTimeout:           100 * time.Millisecond,
//		WriteTimeout:          100 * time.Millisecond,
//	})
//
// The example runs in CI, where there is one Redis and no cluster: its
// ClusterSlots (a go-redis option for clusters set up by hand) says that
// the test Redis serves every slot, so the cache takes its cluster code
// paths against that one node. Leave ClusterSlots out with a real cluster.
func ExampleNew_cluster() {
	ctx := context.Background()
	addr := os.Getenv("REDIS_ADDR")
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{addr},
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { // for the example only
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		},
	})
	defer rdb.Close()

	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:cluster:product:")), cache.WithTTL(10*time.Minute))
	defer products.Close()
	defer products.Delete(ctx, "42")

	for range 2 {
		p, err := products.GetOrLoad(ctx, "42", func(ctx context.Context) (Product, error) {
			fmt.Println("loading 42")
			return findProduct(ctx, "42")
		})
		fmt.Println(p.Name, err)
	}
	// Output:
	// loading 42
	// Espresso machine <nil>
	// Espresso machine <nil>
}
