// The versioned Set: two writers of one product whose Sets land in the
// opposite order of their database writes.

package cache_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
)

// Version carries the row version the database returned with the write:
// the Set of the older write, landing last, is refused, and the newer
// price stays.
func ExampleVersion() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	products := cache.New[Product](rdb, cache.WithPrefix(uniquePrefix("example:version:product:")))
	defer products.Close()
	defer products.Delete(ctx, "42")

	// Writer A's UPDATE returned version 7, writer B's (later) version 8;
	// B's Set comes first.
	_ = products.Set(ctx, "42", Product{ID: "42", Name: "lamp, 25 EUR"}, cache.Version(8))
	err := products.Set(ctx, "42", Product{ID: "42", Name: "lamp, 20 EUR"}, cache.Version(7))
	if errors.Is(err, cache.ErrOlderVersion) {
		err = nil // the newer value is cached: nothing to do
	}
	p, _ := products.Get(ctx, "42")
	fmt.Println(p.Name, err)
	// Output: lamp, 25 EUR <nil>
}
