package health

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/rediserr"
)

// TestClosedClientIsNoOutage: a call on a closed client neither counts
// towards the breaker nor is logged, as an outage or as a refusal.
func TestClosedClientIsNoOutage(t *testing.T) {
	h, buf := logged(t)
	b := NewBreaker(2, 1e9, h, errOpen)
	closed := fmt.Errorf("the lease script: %w", redis.ErrClosed)
	for range 5 {
		b.Record("k", rediserr.Classify(closed, false), closed)
	}
	h.NearRefused("p:", closed)
	if b.Open() {
		t.Error("a closed client opened the breaker")
	}
	if buf.Len() != 0 {
		t.Errorf("logged:\n%s", buf)
	}
}
