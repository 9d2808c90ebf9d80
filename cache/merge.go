// This file shares a key's flight among this process's concurrent callers
// (x/sync/singleflight) while each caller still returns when its own context
// ends: inline when the context cannot end, else on reused goroutines
// (internal/workers).

package cache

import (
	"context"

	"github.com/stampede-go/stampede/internal/workers"
)

// flightCall is one caller's request for a key's flight. It is pooled per
// Cache, with its flight function bound once, so that a hit allocates no
// closure for singleflight.
type flightCall[V any] struct {
	c    *Cache[V]
	ctx  context.Context
	key  string
	load func(context.Context) (V, error)
	opts callOptions         // the first caller's: they decide the flight
	fn   func() (any, error) // fc.flight, bound when fc was made
	done chan outcome        // buffered: a worker never blocks on a caller that left
}

func (fc *flightCall[V]) flight() (any, error) { return fc.c.flight(fc.ctx, fc.key, fc.load, fc.opts) }

// Run is the worker's side of merged.
func (fc *flightCall[V]) Run() {
	v, err, _ := fc.c.group.Do(fc.key, fc.fn)
	fc.done <- outcome{v, err} // the last use of fc by the worker
}

type outcome struct {
	v   any
	err error
}

// merged runs key's flight with load, or waits for the flight already
// running, and returns its outcome; or ctx.Err() as soon as ctx ends, the
// flight going on without this caller.
func (c *Cache[V]) merged(ctx context.Context, key string, load func(context.Context) (V, error), o callOptions) (any, error) {
	fc, _ := c.calls.Get().(*flightCall[V])
	if fc == nil {
		fc = &flightCall[V]{c: c, done: make(chan outcome, 1)}
		fc.fn = fc.flight
	}
	fc.ctx, fc.key, fc.load, fc.opts = ctx, key, load, o
	if ctx.Done() == nil { // nothing can end this caller's wait: no goroutine, no channel
		v, err, _ := c.group.Do(key, fc.fn)
		c.reuse(fc)
		return v, err
	}
	flights.Run(fc)
	select {
	case out := <-fc.done:
		c.reuse(fc)
		return out.v, out.err
	case <-ctx.Done():
		return nil, ctx.Err() // a worker may still run fc's flight and send to fc: never reuse it
	}
}

// reuse returns fc, which nothing uses any more, to the pool.
func (c *Cache[V]) reuse(fc *flightCall[V]) {
	fc.ctx, fc.key, fc.load, fc.opts = nil, "", nil, callOptions{} // keep nothing of the caller alive
	c.calls.Put(fc)
}

// flights runs the flights of every Cache in the process.
var flights = workers.New()
