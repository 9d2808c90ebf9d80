// This file sets up the package's tests: the real Redis they run against
// (the examples read its address from REDIS_ADDR) and the leak check.

package cacheslog_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	if err := redistest.Export(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(redistest.Finish(m.Run()))
}
