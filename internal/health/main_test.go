package health

import (
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
)

// TestMain gives Ping's tests the shared test Redis and checks for leaks.
func TestMain(m *testing.M) {
	os.Exit(redistest.Finish(m.Run()))
}
