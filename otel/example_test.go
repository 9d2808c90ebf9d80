// This file shows the adapter's use; the example runs in CI against the
// test Redis, whose address TestMain puts in REDIS_ADDR.

package cacheotel_test

import (
	"context"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	cacheotel "github.com/stampede-go/stampede/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func ExampleObserver() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	// A service would give the MeterProvider a PeriodicReader with an OTLP or
	// Prometheus exporter, or set the global one; here a manual reader shows
	// the figures.
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)

	obs, err := cacheotel.Observer("products", cacheotel.WithMeterProvider(provider))
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	// Without the near cache every hit is a Redis lookup, so the figures are
	// the same on every run; with it, repeated hits count as cache.near.hits
	// once the process holds its coherence lease.
	products := cache.New[string](rdb, cache.WithPrefix("example:otel:"), cache.WithObserver(obs), cache.WithoutNearCache())
	defer products.Close()
	_ = products.Delete(ctx, "42")
	defer products.Delete(ctx, "42")
	for range 3 {
		_, _ = products.GetOrLoad(ctx, "42", func(context.Context) (string, error) { return "Espresso machine", nil })
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					result, _ := dp.Attributes.Value(cacheotel.KeyLookupResult)
					fmt.Printf("%s{%s} %d\n", m.Name, result.String(), dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					outcome, _ := dp.Attributes.Value(cacheotel.KeyOutcome)
					fmt.Printf("%s{%s} count %d\n", m.Name, outcome.String(), dp.Count)
				}
			}
		}
	}
	// Unordered output:
	// cache.lookups{hit} 2
	// cache.lookups{miss} 1
	// cache.load.duration{ok} count 1
	// cache.write.duration{ok} count 1
}
