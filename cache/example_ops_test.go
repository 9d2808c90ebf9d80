// This file shows the operations users of FusionCache and
// go-redis/cache look for: DeleteByTag, Clear, Expire, SkipNear and Stats.

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

// Expire makes the next read load anew, in every process. Under WithStale
// the old value stays as the fallback: if the database fails, the read
// gets the old value, marked stale, instead of an error.
func ExampleCache_Expire() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:expire:product:")), cache.WithStale(time.Hour))
	defer products.Close()
	defer products.Delete(ctx, "42")

	p, _ := products.GetOrLoad(ctx, "42", func(ctx context.Context) (Product, error) { return findProduct(ctx, "42") })
	fmt.Println("loaded:", p.Price)

	_ = products.Expire(ctx, "42")
	p, _ = products.GetOrLoad(ctx, "42", func(context.Context) (Product, error) {
		return Product{ID: "42", Name: "Espresso machine", Price: 17900}, nil // the new price
	})
	fmt.Println("after Expire, loaded anew:", p.Price)

	_ = products.Expire(ctx, "42")
	var info cache.ResultInfo
	p, err := products.GetOrLoad(cache.WithResultInfo(ctx, &info), "42", func(context.Context) (Product, error) {
		return Product{}, errors.New("database down")
	})
	fmt.Println("database down:", p.Price, err, "stale:", info.Stale)
	// Output:
	// loaded: 19900
	// after Expire, loaded anew: 17900
	// database down: 17900 <nil> stale: true
}

// SkipNear reads the shared copy in Redis even when the value is in this
// process's memory; Stats counts where reads were served from.
func ExampleSkipNear() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:skipnear:product:")), cache.WithoutNearCache())
	defer products.Close()
	defer products.Delete(ctx, "42")
	load := func(ctx context.Context) (Product, error) { return findProduct(ctx, "42") }

	_, _ = products.GetOrLoad(ctx, "42", load)                   // a miss: loaded
	_, _ = products.GetOrLoad(ctx, "42", load, cache.SkipNear()) // a Redis hit, whatever memory holds
	s := products.Stats()
	fmt.Println("misses:", s.Misses, "loads:", s.Loads, "redis hits:", s.RedisHits, "near hits:", s.NearHits)
	// Output:
	// misses: 1 loads: 1 redis hits: 1 near hits: 0
}

// DeleteByTag drops every value stored with a tag, without knowing their
// keys: here every product of category 7, tagged by the call or by the
// loader once it knows the category.
func ExampleCache_DeleteByTag() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:tags:product:")), cache.WithTags())
	defer products.Close()
	defer products.Clear(ctx)

	_ = products.Set(ctx, "1", Product{ID: "1", Name: "Grinder"}, cache.Tags("category:7"))
	_, _ = products.GetOrLoad(ctx, "2", func(ctx context.Context) (Product, error) {
		cache.AddTags(ctx, "category:7") // the loader read the row and knows its category
		return Product{ID: "2", Name: "Kettle"}, nil
	})
	_ = products.Set(ctx, "3", Product{ID: "3", Name: "Scale"}, cache.Tags("category:8"))

	_ = products.DeleteByTag(ctx, "category:7")
	for _, id := range []string{"1", "2", "3"} {
		_, err := products.Get(ctx, id)
		fmt.Println(id, "cached:", err == nil)
	}
	// Output:
	// 1 cached: false
	// 2 cached: false
	// 3 cached: true
}

// Clear drops every value of the Cache, in every process, in one write.
func ExampleCache_Clear() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:clear:product:")), cache.WithTags())
	defer products.Close()

	_ = products.Set(ctx, "1", Product{ID: "1", Name: "Grinder"})
	_ = products.Set(ctx, "2", Product{ID: "2", Name: "Kettle"}, cache.Tags("category:7"))
	_ = products.Clear(ctx)
	_, err1 := products.Get(ctx, "1")
	_, err2 := products.Get(ctx, "2")
	fmt.Println(errors.Is(err1, cache.ErrCacheMiss), errors.Is(err2, cache.ErrCacheMiss))
	// Output:
	// true true
}
