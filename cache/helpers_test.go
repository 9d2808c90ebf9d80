// This file holds what the tests share: clients, keys and a counting
// loader.

package cache

import (
	"context"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
)

// product is the value type most tests cache.
type product struct {
	ID    string            `json:"id"`
	Price int               `json:"price"`
	Tags  map[string]string `json:"tags,omitempty"`
}

// setup returns a client of the test Redis and a key prefix that is cleaned
// up after the test.
func setup(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	return rdb, redistest.Prefix(t, rdb)
}

// counter is a loader that counts its calls and returns a product after an
// optional delay.
type counter struct {
	calls atomic.Int64
	delay time.Duration
}

func (c *counter) load(ctx context.Context) (product, error) {
	n := c.calls.Add(1)
	if c.delay > 0 {
		time.Sleep(c.delay)
	}
	return product{ID: "p1", Price: int(n), Tags: map[string]string{"sale": "yes"}}, nil
}

// deadAddr is a loopback address nothing listens on, nor will (see
// redistest.DeadAddr).
func deadAddr(t *testing.T) string { return redistest.DeadAddr(t) }

// dialOnce makes the client's pool give up a refused dial at once, as
// go-redis did up to v9.5 (the root module's lowest): later versions try 5
// times, 100 ms apart (Options.DialerRetries, a field v9.5 lacks), and the
// tests of an unreachable Redis paid 0.4 s for every call that dialled.
func dialOnce(o *redis.Options) *redis.Options {
	if f := reflect.ValueOf(o).Elem().FieldByName("DialerRetries"); f.IsValid() && f.CanInt() {
		f.SetInt(1)
	}
	return o
}

// freeAddr is a loopback address nothing listens on now, for a test that
// starts listening there later (another process may take it meanwhile:
// rare, and that test then fails to listen, it does not pass wrongly).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// stampede runs callers goroutines on each of the caches at once against key
// and returns their errors (nil entries for successes) and values.
func stampede(t *testing.T, caches []*Cache[product], callers int, key string, load func(context.Context) (product, error)) ([]product, []error) {
	t.Helper()
	n := len(caches) * callers
	vals, errs := make([]product, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			vals[i], errs[i] = caches[i%len(caches)].GetOrLoad(t.Context(), key, load)
		})
	}
	close(start)
	wg.Wait()
	return vals, errs
}
