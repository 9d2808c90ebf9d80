// This file is the configuration of an observer, and the creation of its instruments.

package cacheotel

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Option configures [Observer] and [LockObserver].
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

// start reads opts and returns the meter they name, the attributes every
// data point of an observer named name gets (WithAttributes's, then
// key=name: the package's own last, so that it wins in a set), and an
// error if name is empty (what names the cache or the lock job).
func start(opts []Option, key attribute.Key, what, name string) (*instruments, []attribute.KeyValue) {
	cfg := config{}
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.provider == nil {
		cfg.provider = otel.GetMeterProvider()
	}
	in := &instruments{m: cfg.provider.Meter(ScopeName)}
	if name == "" {
		in.errs = append(in.errs, fmt.Errorf("cacheotel: the %s name must not be empty", what))
	}
	return in, append(append([]attribute.KeyValue(nil), cfg.attrs...), key.String(name))
}

// instruments creates an observer's instruments on one meter; one it
// cannot create is a no-op, and its error is kept for err.
type instruments struct {
	m    metric.Meter
	errs []error
}

func (in *instruments) counter(name, unit, desc string) metric.Int64Counter {
	c, err := in.m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.errs = append(in.errs, err)
	return c
}

// histogram is a duration's, in seconds, with the package's Buckets.
func (in *instruments) histogram(name, desc string) metric.Float64Histogram {
	h, err := in.m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(Buckets...))
	in.errs = append(in.errs, err)
	return h
}

// err is every error met so far.
func (in *instruments) err() error { return errors.Join(in.errs...) }
