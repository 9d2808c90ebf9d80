// main_test.go sets up the package's tests: the real Redis they run against,
// the child-process modes of the multi-process tests, and the leak check.

package cache

import (
	"fmt"
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/leaktest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	if err := redistest.Export(); err != nil { // the examples read REDIS_ADDR
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	redistest.Stop()
	if code == 0 {
		if err := leaktest.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
