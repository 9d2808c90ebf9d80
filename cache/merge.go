// merge.go shares a key's flight among this process's concurrent callers
// (x/sync/singleflight) while each caller still returns when its own context
// ends: inline when the context cannot end, else on reused goroutines,
// which keep the stacks they grew instead of growing a new one per flight.

package cache

import (
	"context"
	"time"
)

// merged runs fn as the flight of key, or waits for the flight already
// running, and returns its outcome; or ctx.Err() as soon as ctx ends, the
// flight going on without this caller.
func (c *Cache[V]) merged(ctx context.Context, key string, fn func() (any, error)) (any, error) {
	if ctx.Done() == nil { // nothing can end this caller's wait: no goroutine, no channel
		v, err, _ := c.group.Do(key, fn)
		return v, err
	}
	ch := make(chan outcome, 1)
	flights.run(func() {
		v, err, _ := c.group.Do(key, fn)
		ch <- outcome{v, err}
	})
	select {
	case o := <-ch:
		return o.v, o.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type outcome struct {
	v   any
	err error
}

// workerIdle is how long an idle worker waits for work before it ends, so
// that a process at rest runs none (and leak checkers find none).
var workerIdle = 200 * time.Millisecond

// workers runs jobs on reused goroutines; it is safe for concurrent use.
// Each worker ends after workerIdle without a job.
type workers struct{ jobs chan func() }

// flights runs the flights of every Cache in the process.
var flights = workers{jobs: make(chan func())}

// run hands job to an idle worker, or to a new one.
func (w workers) run(job func()) {
	select {
	case w.jobs <- job:
	default:
		go w.work(job)
	}
}

func (w workers) work(job func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(workerIdle)
		select {
		case job = <-w.jobs:
		case <-idle.C:
			return
		}
	}
}
