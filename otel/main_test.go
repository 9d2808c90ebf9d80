// This file sets up the package's tests: the real Redis they run against
// (the examples read its address from REDIS_ADDR) and the leak check.

package cacheotel_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if err := redistest.Export(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	redistest.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
