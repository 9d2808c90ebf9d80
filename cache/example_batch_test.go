// This file shows GetOrLoadMany as a page of products is read:
// one query for the products the cache lacks, whatever their number.

package cache_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

// findProducts stands in for one database query for several IDs
// ("SELECT ... WHERE id IN (...)"): IDs it does not find are left out.
func findProducts(_ context.Context, ids []string) (map[string]Product, error) {
	catalog := map[string]Product{
		"1": {ID: "1", Name: "Grinder", Price: 8900},
		"2": {ID: "2", Name: "Kettle", Price: 4500},
		"3": {ID: "3", Name: "Scale", Price: 2900},
	}
	found := make(map[string]Product, len(ids))
	for _, id := range ids {
		if p, ok := catalog[id]; ok {
			found[id] = p
		}
	}
	return found, nil
}

func ExampleCache_GetOrLoadMany() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()

	products := cache.New[Product](rdb, cache.WithPrefix("example:many:product:"))
	defer products.Close()
	page := []string{"1", "2", "3", "404"}
	defer products.Delete(ctx, page...)

	// Product 1 is already cached, by a single-key read or a write-through.
	if err := products.Set(ctx, "1", Product{ID: "1", Name: "Grinder", Price: 8900}); err != nil {
		fmt.Println("error:", err)
		return
	}
	loadMany := func(ctx context.Context, ids []string) (map[string]Product, error) {
		fmt.Println("query for", strings.Join(slices.Sorted(slices.Values(ids)), ", "))
		return findProducts(ctx, ids)
	}
	for range 2 {
		found, err := products.GetOrLoadMany(ctx, page, loadMany)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		for _, id := range page {
			if p, ok := found[id]; ok {
				fmt.Println(id, p.Name, p.Price)
			} else {
				fmt.Println(id, "not found")
			}
		}
	}
	// Output:
	// query for 2, 3, 404
	// 1 Grinder 8900
	// 2 Kettle 4500
	// 3 Scale 2900
	// 404 not found
	// 1 Grinder 8900
	// 2 Kettle 4500
	// 3 Scale 2900
	// 404 not found
}
