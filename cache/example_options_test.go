// This file shows options a service sets once, in New: an
// observer for metrics and a codec other than JSON.

package cache_test

import (
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

// An observer receives every step of the cache's work, for metrics (the
// otel module turns them into OpenTelemetry metrics) or logs. It runs on
// the goroutine doing the work, the hit path included: it must be quick and
// safe for concurrent use.
func ExampleWithObserver() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()

	var mu sync.Mutex
	var kinds []cache.EventKind
	products := cache.New[Product](rdb,
		cache.WithPrefix(uniquePrefix("example:observer:product:")),
		// Without a near cache, whose events (near_hit, near_invalidation...)
		// come from its own goroutines, at times that vary.
		cache.WithoutNearCache(),
		cache.WithObserver(func(e cache.Event) {
			mu.Lock()
			defer mu.Unlock()
			kinds = append(kinds, e.Kind) // e.Key, e.Duration and e.Err say more
		}),
	)
	defer products.Close()
	defer products.Delete(ctx, "42")

	for range 2 {
		_, _ = products.GetOrLoad(ctx, "42", func(ctx context.Context) (Product, error) {
			return findProduct(ctx, "42")
		})
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(kinds)
	// Output: [miss load hit]
}

// gobCodec stores values with encoding/gob instead of JSON. A Codec must be
// safe for concurrent use; Unmarshal gets a pointer to a fresh value.
// (examples/msgpack has a MessagePack codec, in a module of its own.)
type gobCodec struct{}

func (gobCodec) Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	err := gob.NewEncoder(&buf).Encode(v)
	return buf.Bytes(), err
}

func (gobCodec) Unmarshal(data []byte, v any) error {
	return gob.NewDecoder(bytes.NewReader(data)).Decode(v)
}

// Every process that reads the keys must use the same codec; bytes a codec
// cannot read count as a miss and are replaced by the next load.
func ExampleWithCodec() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	})
	defer rdb.Close()
	products := cache.New[Product](rdb,
		cache.WithPrefix(uniquePrefix("example:codec:product:")),
		cache.WithCodec(gobCodec{}),
	)
	defer products.Close()
	defer products.Delete(ctx, "42")

	p, err := products.GetOrLoad(ctx, "42", func(ctx context.Context) (Product, error) {
		return findProduct(ctx, "42")
	})
	fmt.Println(p, err)

	p, err = products.Get(ctx, "42") // decoded by gobCodec from Redis
	fmt.Println(p, err)
	// Output:
	// {42 Espresso machine 19900} <nil>
	// {42 Espresso machine 19900} <nil>
}
