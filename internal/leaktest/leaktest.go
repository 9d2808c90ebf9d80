// Package leaktest finds goroutines a test run left behind. It does what
// go.uber.org/goleak's Find does for this repository's TestMains, in a few
// lines, because every requirement of the root module lands in the go.sum of
// a project that imports the cache (CI bounds it at 20 lines).
package leaktest

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// harmless are frames of goroutines that the runtime and the testing
// package own.
var harmless = []string{
	"testing.(*M).",
	"testing.tRunner(",
	"testing.runFuzzing(",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime/trace.",
}

// Find returns an error listing the goroutines, other than the caller's and
// the runtime's, still running after up to 5 s for them to end (connection
// readers end a moment after their Close returns).
func Find() error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC() // a cache dropped without Close releases its goroutines when collected
		leaks := leaked()
		if len(leaks) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d goroutines leaked:\n\n%s", len(leaks), strings.Join(leaks, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaked returns the stacks of the goroutines that are neither the caller
// nor harmless.
func leaked() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 { // runtime.Stack lists the caller first
			continue
		}
		s := string(g)
		if isHarmless(s) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func isHarmless(stack string) bool {
	for _, h := range harmless {
		if strings.Contains(stack, h) {
			return true
		}
	}
	return false
}
