// This file shows the work the cache does in the background so
// that callers need not wait: stale values served while the database fails
// (WithStale, WithResultInfo), a short wait for the refresh
// (WithSoftLoadTimeout), a hot key refreshed before it expires
// (WithEarlyRefresh), and Close waiting for that work to end. The TTLs are
// short so that the examples run quickly; the sleeps only ever wait past an
// expiry, which makes the output certain.

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

var errDatabaseDown = errors.New("database unreachable")

// The database goes down after a product was cached. WithStale keeps the
// value in Redis past its TTL, and callers get it, marked stale in the
// ResultInfo, instead of an error; one refresh at a time tries the database
// in the background (at most once per WithStaleThrottle while it fails).
func ExampleWithStale() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb,
		cache.WithPrefix(uniquePrefix("example:stale:product:")),
		cache.WithTTL(50*time.Millisecond), // short for the example; minutes in production
		cache.WithStale(time.Hour),         // serve a value up to an hour past its TTL
	)
	defer products.Close()
	defer products.Delete(ctx, "42")

	databaseUp := true
	load := func(ctx context.Context) (Product, error) {
		if !databaseUp {
			return Product{}, errDatabaseDown
		}
		return findProduct(ctx, "42")
	}
	for _, up := range []bool{true, false} {
		databaseUp = up
		var info cache.ResultInfo
		p, err := products.GetOrLoad(cache.WithResultInfo(ctx, &info), "42", load)
		fmt.Printf("database up %v: %s, %v, stale %v\n", up, p.Name, err, info.Stale)
		time.Sleep(100 * time.Millisecond) // past the TTL
	}
	// Output:
	// database up true: Espresso machine, <nil>, stale false
	// database up false: Espresso machine, <nil>, stale true
}

// A stale value with WithSoftLoadTimeout: the caller waits up to the soft
// timeout for the refresh it started, gets the fresh value if the database
// answers in time, and the stale one if not (the refresh goes on).
func ExampleWithSoftLoadTimeout() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	prices := cache.New[int](rdb,
		cache.WithPrefix(uniquePrefix("example:softtimeout:price:")),
		cache.WithTTL(50*time.Millisecond),
		cache.WithStale(time.Hour),
		cache.WithSoftLoadTimeout(500*time.Millisecond),
	)
	defer prices.Close()
	defer prices.Delete(ctx, "sku-1")

	get := func(load func(context.Context) (int, error)) {
		var info cache.ResultInfo
		price, err := prices.GetOrLoad(cache.WithResultInfo(ctx, &info), "sku-1", load)
		fmt.Println(price, err, "stale:", info.Stale)
		time.Sleep(100 * time.Millisecond) // past the TTL
	}
	get(func(context.Context) (int, error) { return 100, nil })
	get(func(context.Context) (int, error) { return 120, nil }) // a quick database: the fresh value
	stuck := make(chan struct{})
	get(func(context.Context) (int, error) { <-stuck; return 130, nil }) // a stuck one: the stale value
	close(stuck)                                                         // Close waits for that refresh
	// Output:
	// 100 <nil> stale: false
	// 120 <nil> stale: false
	// 120 <nil> stale: true
}

// Early refresh reloads a hot key in the background shortly before it
// expires, so that its callers never wait for the database: the caller
// that triggers it gets the current value at once. How early depends on
// how long the value took to load (here 200ms: a refresh may start from
// about 200ms before the expiry) and on beta.
func ExampleWithEarlyRefresh() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	refreshed := make(chan struct{}, 1)
	rankings := cache.New[string](rdb,
		cache.WithPrefix(uniquePrefix("example:earlyrefresh:ranking:")),
		cache.WithTTL(time.Second),
		cache.WithoutJitter(),
		cache.WithEarlyRefresh(cache.DefaultEarlyRefresh), // the default: 1
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventRefresh {
				select {
				case refreshed <- struct{}{}:
				default:
				}
			}
		}),
	)
	defer rankings.Close()
	defer rankings.Delete(ctx, "weekly")

	version := 0
	load := func(context.Context) (string, error) {
		time.Sleep(200 * time.Millisecond) // a slow query
		version++
		return fmt.Sprint("ranking v", version), nil
	}
	r, _ := rankings.GetOrLoad(ctx, "weekly", load)
	fmt.Println("load:", r)

	time.Sleep(900 * time.Millisecond) // within one load time of the expiry
	r, _ = rankings.GetOrLoad(ctx, "weekly", load)
	fmt.Println("hit near the expiry:", r, "(a refresh starts)")

	<-refreshed
	r, _ = rankings.Get(ctx, "weekly")
	fmt.Println("after the refresh:", r)
	// Output:
	// load: ranking v1
	// hit near the expiry: ranking v1 (a refresh starts)
	// after the refresh: ranking v2
}

// Close ends a Cache at shutdown: it gives back the subscriptions the
// caches on its Redis client share (the last Cache to close ends them) and
// waits for its background refreshes, so that a value being refreshed is
// stored before the process exits. Close the caches before the client.
func ExampleCache_Close() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close() // deferred first: runs last, after the caches are closed
	prefix := uniquePrefix("example:close:price:")
	prices := cache.New[int](rdb,
		cache.WithPrefix(prefix),
		cache.WithTTL(50*time.Millisecond),
		cache.WithStale(time.Hour),
	)
	defer rdb.Del(ctx, prefix+"sku-1")

	_, _ = prices.GetOrLoad(ctx, "sku-1", func(context.Context) (int, error) { return 100, nil })
	time.Sleep(100 * time.Millisecond) // past the TTL: the next read refreshes it
	price, _ := prices.GetOrLoad(ctx, "sku-1", func(context.Context) (int, error) {
		time.Sleep(100 * time.Millisecond) // the refresh is slow
		return 120, nil
	})
	fmt.Println("served:", price, "(stale; the refresh runs in the background)")

	if err := prices.Close(); err != nil { // waits for the refresh
		fmt.Println("close:", err)
	}
	price, _ = prices.Get(ctx, "sku-1") // calls after Close still work
	fmt.Println("stored before Close returned:", price)
	// Output:
	// served: 100 (stale; the refresh runs in the background)
	// stored before Close returned: 120
}
