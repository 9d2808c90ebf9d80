// This file holds what the tests share: clients, keys, a counting
// loader and a Redis command counter.

package cache

import (
	"context"
	"errors"
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

// cmdCounter is a go-redis hook that counts commands by name.
type cmdCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func countCommands(rdb *redis.Client) *cmdCounter {
	c := &cmdCounter{n: map[string]int{}}
	rdb.AddHook(c)
	return c
}

func (c *cmdCounter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.n[cmd.Name()]++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		for _, cmd := range cmds {
			c.n[cmd.Name()]++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// delayHook delays every command whose name is cmd.
type delayHook struct {
	cmd   string
	delay time.Duration
}

func (h delayHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h delayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == h.cmd {
			time.Sleep(h.delay)
		}
		return next(ctx, cmd)
	}
}
func (h delayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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

// isScript matches a script call: EVALSHA, or the EVAL that go-redis falls
// back to when the server has not loaded the script yet.
func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

// resendHook runs every script call twice, as go-redis does when the reply
// to the first run is lost, and keeps the second reply.
type resendHook struct{}

func (h resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}
func (h resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// lostReplyHook runs every script call and then reports a network error in
// place of its reply: the script took effect, the client does not know it.
type lostReplyHook struct{}

func (h lostReplyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lostReplyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if isScript(cmd) && err == nil {
			err = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("reply lost")}
			cmd.SetErr(err)
		}
		return err
	}
}
func (h lostReplyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
