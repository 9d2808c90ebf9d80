// example_test.go shows the package's use; the examples run in CI against the
// test Redis, whose address TestMain puts in REDIS_ADDR.

package cache_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	products := cache.New[Product](rdb, cache.WithPrefix("example:product:"), cache.WithTTL(10*time.Minute))
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
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	// A hot catalogue: short TTL, a lock lease that outlives a slow query's
	// refresh interval, and waiters that poll for up to 5s (50 x 100ms).
	products := cache.New[Product](rdb,
		cache.WithPrefix("example:product:"),
		cache.WithTTL(30*time.Second),
		cache.WithNotFoundTTL(5*time.Second),
		cache.WithLockTTL(3*time.Second),
		cache.WithRetry(50, 100*time.Millisecond),
		cache.WithFailurePolicy(cache.FailOpen),
	)
	fmt.Printf("%T\n", products)
	// Output: *cache.Cache[github.com/stampede-go/stampede/cache_test.Product]
}

func ExampleCache_GetOrLoad() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix("example:product:"))
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
