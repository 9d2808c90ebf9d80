// main_test.go sets up the package's tests: the real Redis they run against
// and the leak check.

package lock

import (
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if err := redistest.Export(); err != nil { // the examples read REDIS_ADDR
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

// setup returns a client of the test Redis and a key prefix that is cleaned
// up after the test.
func setup(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	return rdb, redistest.Prefix(t, rdb)
}
