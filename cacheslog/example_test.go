// This file shows the package's use; the example runs in CI against the
// test Redis, whose address TestMain puts in REDIS_ADDR.

package cacheslog_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/cacheslog"
)

// A Delete overtakes a load: the loaded value, older than the delete, is
// not stored, and both the hook and the observer say so at Info.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	// No time, and no error text, so that the output below stays the same.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "error" {
				return slog.Attr{}
			}
			return a
		},
	}))
	products := cache.New[string](rdb, cache.WithPrefix("example:slog:"),
		cache.WithErrorHook(cacheslog.ErrorHook(logger)),
		cache.WithObserver(cacheslog.Observer(logger)))
	defer products.Close()
	defer products.Delete(ctx, "42")

	_, err := products.GetOrLoad(ctx, "42", func(ctx context.Context) (string, error) {
		// The product is updated in the database while it is being loaded.
		if err := products.Delete(ctx, "42"); err != nil {
			return "", err
		}
		return "Espresso machine, old price", nil
	})
	fmt.Println("error:", err)
	// The Delete won over the load, as designed: nothing is logged.
	// Output:
	// error: <nil>
}
