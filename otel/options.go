// This file is the configuration of an Observer.

package cacheotel

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Option configures [Observer].
type Option func(*config)

type config struct {
	provider metric.MeterProvider
	attrs    []attribute.KeyValue
}

// WithMeterProvider sets the MeterProvider the instruments come from.
// Default: [go.opentelemetry.io/otel.GetMeterProvider], the global one at the
// time Observer is called (a no-op until the application sets one).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.provider = mp }
}

// WithAttributes adds constant attributes to every data point, such as a
// deployment's region. They must have bounded values; the package's own
// attributes (cache.name and the rest) win over ones with the same key.
// Default: none.
func WithAttributes(kv ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, kv...) }
}
