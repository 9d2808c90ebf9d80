// Package workers runs jobs on reused goroutines, which keep the stacks
// they grew instead of growing a new one per job, and end after a while
// without work, so that a process at rest runs none.
package workers

import "time"

// Job is work for a worker.
type Job interface{ Run() }

// Idle is how long an idle worker waits for work before it ends (so that
// leak checkers find none at rest). A variable for tests.
var Idle = 200 * time.Millisecond

// Pool runs jobs on reused goroutines. Make it with New; safe for
// concurrent use.
type Pool struct{ jobs chan Job }

// New returns an empty pool.
func New() Pool { return Pool{jobs: make(chan Job)} }

// Run hands j to an idle worker, or to a new one.
func (p Pool) Run(j Job) {
	select {
	case p.jobs <- j:
	default:
		go p.work(j)
	}
}

func (p Pool) work(j Job) {
	idle := time.NewTimer(Idle)
	defer idle.Stop()
	for {
		j.Run()
		idle.Reset(Idle)
		select {
		case j = <-p.jobs:
		case <-idle.C:
			return
		}
	}
}
