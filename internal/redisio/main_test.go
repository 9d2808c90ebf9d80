// main_test.go sets up the package's tests: the real Redis they run against
// and the leak check.

package redisio

import (
	"fmt"
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/leaktest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
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
