package health

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestPingNamesTheAddress(t *testing.T) {
	t.Parallel()
	live := redistest.Addr(t)
	if err := Ping(t.Context(), redistest.Client(t, live)); err != nil {
		t.Fatalf("Ping(live) = %v; want nil", err)
	}

	dead := redistest.DeadAddr(t)
	rdb := redis.NewClient(redistest.DialOnce(&redis.Options{Addr: dead, MaxRetries: -1, DialTimeout: 200 * time.Millisecond}))
	defer rdb.Close()
	err := Ping(t.Context(), rdb)
	if want := "cache: ping redis at " + dead + ": dial tcp " + dead; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Ping(dead) = %v; want an error starting %q", err, want)
	}

	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": live, "b": dead}, DialTimeout: 200 * time.Millisecond})
	defer ring.Close()
	err = Ping(t.Context(), ring)
	if want := "node " + dead + ": dial tcp " + dead; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Ping(ring) = %v; want an error naming the failing node, %q", err, want)
	}
}
