// This file reads the recorded figures back through the SDK's manual
// reader, by metric name and exact attribute set.

package cacheotel_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stampede-go/stampede/cache"
	cacheotel "github.com/stampede-go/stampede/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// meter is an SDK MeterProvider whose figures a test reads when it wants.
type meter struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
}

func newMeter(t *testing.T) *meter {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(t.Context()) })
	return &meter{reader, provider}
}

// observer is cacheotel.Observer(name) on this meter.
func (m *meter) observer(t *testing.T, name string, opts ...cacheotel.Option) func(cache.Event) {
	t.Helper()
	obs, err := cacheotel.Observer(name, append([]cacheotel.Option{cacheotel.WithMeterProvider(m.provider)}, opts...)...)
	if err != nil {
		t.Fatalf("Observer(%q): %v", name, err)
	}
	return obs
}

// point is one data point: a counter's value, or a histogram's count and sum.
type point struct {
	metric string
	attrs  attribute.Set
	value  int64   // counters
	count  uint64  // histograms
	sum    float64 // histograms
	bounds []float64
	unit   string
}

// collect returns every data point recorded so far (cumulative).
func (m *meter) collect(t *testing.T) []point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	var points []point
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != cacheotel.ScopeName {
			t.Errorf("scope %q; want %q", sm.Scope.Name, cacheotel.ScopeName)
		}
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic && mt.Name != "cache.breaker.open" { // the one up-down counter
					t.Errorf("%s is not monotonic; want a counter", mt.Name)
				}
				for _, dp := range d.DataPoints {
					points = append(points, point{metric: mt.Name, attrs: dp.Attributes, value: dp.Value, unit: mt.Unit})
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					points = append(points, point{metric: mt.Name, attrs: dp.Attributes, count: dp.Count,
						sum: dp.Sum, bounds: dp.Bounds, unit: mt.Unit})
				}
			default:
				t.Errorf("%s: aggregation %T; want a counter or a histogram", mt.Name, mt.Data)
			}
		}
	}
	return points
}

// find returns the data point of metric whose attribute set is exactly
// attrs, and whether there is one.
func find(points []point, metric string, attrs ...attribute.KeyValue) (point, bool) {
	want := attribute.NewSet(attrs...)
	for _, p := range points {
		if p.metric == metric && p.attrs.Equals(&want) {
			return p, true
		}
	}
	return point{}, false
}

// counter is the value of the counter's data point with exactly attrs, 0 if
// there is none.
func counter(points []point, metric string, attrs ...attribute.KeyValue) int64 {
	p, _ := find(points, metric, attrs...)
	return p.value
}

// histogram is the count and sum of the histogram's data point with exactly
// attrs.
func histogram(points []point, metric string, attrs ...attribute.KeyValue) (uint64, float64) {
	p, _ := find(points, metric, attrs...)
	return p.count, p.sum
}

// names lists the metrics that have data points, sorted, without repeats.
func names(points []point) []string {
	var n []string
	for _, p := range points {
		n = append(n, p.metric)
	}
	slices.Sort(n)
	return slices.Compact(n)
}

// noKey fails the test if a data point carries key in an attribute value.
func noKey(t *testing.T, points []point, key string) {
	t.Helper()
	for _, p := range points {
		for _, kv := range p.attrs.ToSlice() {
			if strings.Contains(kv.Value.String(), key) {
				t.Errorf("%s has attribute %s=%q: the key must not be an attribute", p.metric, kv.Key, kv.Value.String())
			}
		}
	}
}

func name(n string) attribute.KeyValue    { return cacheotel.KeyName.String(n) }
func lookup(r string) attribute.KeyValue  { return cacheotel.KeyLookupResult.String(r) }
func outcome(o string) attribute.KeyValue { return cacheotel.KeyOutcome.String(o) }
