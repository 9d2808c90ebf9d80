// This file sets up the package's tests: the real Redis they run against,
// the child-process modes of the multi-process tests, and the leak check.

package cache

import (
	"fmt"
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	testNearPerKey = os.Getenv("STAMPEDE_NEAR_PERKEY") != "" // every strict near cache tracks per key
	proctest.RunChild(childModes)
	if err := redistest.Export(); err != nil { // the examples read REDIS_ADDR
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Most tests wait (on leases, timers, dial retries) far more than they
	// compute: four at a time on two cores halves the package's time.
	redistest.Parallel(4)
	os.Exit(redistest.Finish(m.Run()))
}
