// merge.go shares a key's flight among this process's concurrent callers
// (x/sync/singleflight) while each caller still returns when its own context
// ends: inline when the context cannot end, else on reused goroutines,
// which keep the stacks they grew instead of growing a new one per flight.

package cache

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// merged runs fn as the flight of key, or waits for the flight already
// running, and returns its outcome; or ctx.Err() as soon as ctx ends, the
// flight going on without this caller.
func (c *Cache[V]) merged(ctx context.Context, key string, fn func() (any, error)) (any, error) {
	if ctx.Done() == nil { // nothing can end this caller's wait: no goroutine, no channel
		v, err, _ := c.group.Do(key, fn)
		return v, err
	}
	cl := calls.Get().(*call)
	cl.group, cl.key, cl.fn = &c.group, key, fn
	flights.run(cl)
	select {
	case o := <-cl.done:
		*cl = call{done: cl.done} // the worker is done with it: reuse it
		calls.Put(cl)
		return o.v, o.err
	case <-ctx.Done():
		return nil, ctx.Err() // the worker will still send to cl: never reuse it
	}
}

// call is one caller's wait for a flight, run by a worker.
type call struct {
	group *singleflight.Group
	key   string
	fn    func() (any, error)
	done  chan outcome // buffered: the worker never blocks on a caller that left
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan outcome, 1)} }}

func (cl *call) run() {
	v, err, _ := cl.group.Do(cl.key, cl.fn)
	cl.done <- outcome{v, err} // the last use of cl by the worker
}

type outcome struct {
	v   any
	err error
}

// workerIdle is how long an idle worker waits for work before it ends, so
// that a process at rest runs none (and leak checkers find none).
var workerIdle = 200 * time.Millisecond

// workers runs calls on reused goroutines; it is safe for concurrent use.
// Each worker ends after workerIdle without a call.
type workers struct{ jobs chan *call }

// flights runs the flights of every Cache in the process.
var flights = workers{jobs: make(chan *call)}

// run hands cl to an idle worker, or to a new one.
func (w workers) run(cl *call) {
	select {
	case w.jobs <- cl:
	default:
		go w.work(cl)
	}
}

func (w workers) work(cl *call) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		cl.run()
		idle.Reset(workerIdle)
		select {
		case cl = <-w.jobs:
		case <-idle.C:
			return
		}
	}
}
