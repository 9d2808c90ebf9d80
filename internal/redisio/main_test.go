// This file sets up the package's tests: the real Redis they run against
// and the leak check.

package redisio

import (
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Finish(m.Run()))
}
