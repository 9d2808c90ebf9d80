// This file holds what the tests share: clients, keys, a counting
// loader and a log capture.

package cache

import (
	"context"
	"log/slog"
	"net"
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

// dialCounter is a Redis client whose dials are counted, pointed at addr,
// that dials once per attempt (see redistest.DialOnce).
func dialCounter(t *testing.T, addr string) (*redis.Client, *atomic.Int64) {
	var dials atomic.Int64
	rdb := redis.NewClient(redistest.DialOnce(&redis.Options{
		Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}))
	t.Cleanup(func() { rdb.Close() })
	return rdb, &dials
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

// logCapture is a slog.Handler that keeps the records it is given.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCapture) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *logCapture) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCapture) WithGroup(string) slog.Handler      { return h }

func (h *logCapture) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.recs)
}

// lines returns the records at level, each as its message and attributes.
func (h *logCapture) lines(level slog.Level) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level != level {
			continue
		}
		line := r.Message
		r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
		out = append(out, line)
	}
	return out
}

// defaultLogger makes slog.Default() write to a capture for the test.
func defaultLogger(t *testing.T) *logCapture {
	h := &logCapture{}
	old := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(old) })
	return h
}
