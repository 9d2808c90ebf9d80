// This file is the -metrics flag: the OpenTelemetry adapter
// (github.com/stampede-go/stampede/otel) on the stampede caches of this
// process, read through the SDK's manual reader and printed as a table once
// the strategies have run. A service would use a PeriodicReader with an OTLP
// or Prometheus exporter instead.
package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/stampede-go/stampede/cache"
	cacheotel "github.com/stampede-go/stampede/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// cacheOptions are added to the caches of a strategy built in this process
// (see newInstance); -metrics puts an observer per stampede strategy there
// for the length of a run. Set before the instances start and reset after
// they end, so they only read it.
var cacheOptions map[string][]cache.Option

// metrics is the MeterProvider behind the observer and its reader.
type metrics struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
}

// startMetrics sends the events of the stampede caches built from now on to
// a new MeterProvider, with cache.name the strategy.
func startMetrics() (*metrics, error) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	opts := map[string][]cache.Option{}
	for _, s := range []string{"stampede", "stampede-near"} {
		obs, err := cacheotel.Observer(s, cacheotel.WithMeterProvider(provider))
		if err != nil {
			return nil, err
		}
		opts[s] = []cache.Option{cache.WithObserver(obs)}
	}
	cacheOptions = opts
	return &metrics{reader, provider}, nil
}

// stop detaches the observer from caches built later and shuts the
// provider down.
func (m *metrics) stop() {
	cacheOptions = nil
	_ = m.provider.Shutdown(context.Background())
}

// metricRow is one data point: a counter's value, or a histogram's count and
// sum (seconds).
type metricRow struct {
	Metric string
	Cache  string // cache.name: the strategy
	Attrs  string // the attributes other than cache.name, k=v comma-separated
	Value  int64
	Hist   bool
	Count  uint64
	Sum    float64
}

// collect reads every data point so far, sorted by metric and attributes.
func (m *metrics) collect(ctx context.Context) ([]metricRow, error) {
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	var rows []metricRow
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					rows = append(rows, metricRow{Metric: mt.Name, Cache: cacheName(dp.Attributes), Attrs: attrs(dp.Attributes.ToSlice()), Value: dp.Value})
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					rows = append(rows, metricRow{Metric: mt.Name, Cache: cacheName(dp.Attributes), Attrs: attrs(dp.Attributes.ToSlice()),
						Hist: true, Count: dp.Count, Sum: dp.Sum})
				}
			}
		}
	}
	slices.SortFunc(rows, func(a, b metricRow) int {
		return strings.Compare(a.Metric+" "+a.Cache+" "+a.Attrs, b.Metric+" "+b.Cache+" "+b.Attrs)
	})
	return rows, nil
}

func cacheName(set attribute.Set) string {
	v, _ := set.Value(cacheotel.KeyName)
	return v.AsString()
}

// attrs formats the attributes other than cache.name.
func attrs(kvs []attribute.KeyValue) string {
	var s []string
	for _, kv := range kvs {
		if kv.Key != cacheotel.KeyName {
			s = append(s, string(kv.Key)+"="+kv.Value.String())
		}
	}
	return strings.Join(s, ",")
}

// write prints the figures so far as a table.
func (m *metrics) write(ctx context.Context, w io.Writer) error {
	rows, err := m.collect(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "metrics of the stampede caches (OpenTelemetry, cache.name = the strategy, all instances of this process):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tcache.name\tattributes\tvalue\tsum\t")
	for _, r := range rows {
		if r.Hist {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.3fs\t\n", r.Metric, r.Cache, r.Attrs, r.Count, r.Sum)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t\t\n", r.Metric, r.Cache, r.Attrs, r.Value)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "value: a counter's total, or a histogram's count (loads, waits); sum: the histogram's total duration.")
	return nil
}
