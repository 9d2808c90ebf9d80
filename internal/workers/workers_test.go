package workers

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

type job struct{ wg *sync.WaitGroup }

func (j job) Run() { j.wg.Done() }

func TestRunsEveryJobAndEndsIdleWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	p := New()
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		p.Run(job{&wg})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the idle time; want %d", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
