// This file sets up the package's tests: the real Redis they run against,
// the leak check, and the removal of the fencing counters the examples leave.

package lock

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/leaktest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	if err := redistest.Export(); err != nil { // the examples read REDIS_ADDR
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	deleteExampleFences()
	redistest.Stop()
	if code == 0 {
		if err := leaktest.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// deleteExampleFences deletes the fencing counters that the examples' locks
// leave behind (the examples delete their lock keys, but the counters are
// meant to outlive the locks): "example:...{T}:fence".
func deleteExampleFences() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	iter := rdb.Scan(ctx, 0, "example:*}"+fenceSuffix, 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

// setup returns a client of the test Redis and a key prefix that is cleaned
// up after the test.
func setup(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	return rdb, redistest.Prefix(t, rdb)
}

// quorumOf3 returns three "masters" for a quorum lock (databases 0 to 2 of
// the test server, as Scripters and as clients), whose keys under p are
// deleted when the test ends.
func quorumOf3(t *testing.T, p string) ([]redis.Scripter, []*redis.Client) {
	t.Helper()
	var masters []redis.Scripter
	var clients []*redis.Client
	for db := range 3 {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), DB: db})
		t.Cleanup(func() { redistest.DeletePrefix(c, p); _ = c.Close() })
		masters, clients = append(masters, c), append(clients, c)
	}
	return masters, clients
}
