// This file proves that a Redis outage is visible by default: logged once at its first failure, named in the breaker's error,
// told by Ping.

package cache

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

func TestWrongAddressLogsOncePerOutage(t *testing.T) {
	// Not parallel: it replaces slog.Default, where other tests' caches log.
	logs := defaultLogger(t)
	addr := deadAddr(t)
	rdb, _ := dialCounter(t, addr)
	caches := fiveCaches(rdb) // five caches, one client: still one line
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() { _ = caches[i%5].waitOnce(t.Context(), "k") })
	}
	wg.Wait()
	errs := logs.lines(slog.LevelError)
	require.Len(t, errs, 1, "log lines for 100 calls on a wrong address: %q", errs)
	assert.Contains(t, errs[0], "redis="+addr)
	assert.Contains(t, errs[0], "connection refused")

	// Under FailClosed the breaker's error says where and why.
	c := New[product](rdb, WithFailurePolicy(FailClosed))
	defer c.Close()
	_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Contains(t, err.Error(), "cache: circuit breaker open: Redis unreachable: redis at "+addr+": dial tcp "+addr)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Len(t, logs.lines(slog.LevelError), 1, "still one line")
}

func TestOutageLoggedAgainAfterRecovery(t *testing.T) {
	// Not parallel: it replaces slog.Default, where other tests' caches log.
	srv := redistest.PrivateServer(t, "it stops and restarts the server")
	rdb := redis.NewClient(dialOnce(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true}))
	defer rdb.Close()
	logs := &logCapture{}
	mine := slog.New(logs)
	silent := defaultLogger(t)
	// Without near caches: within their lease they serve "k" from memory
	// during an outage, and the test needs calls that reach Redis.
	a := New[product](rdb, WithLogger(mine), WithCircuitBreaker(2, 20*time.Millisecond), WithoutNearCache())
	defer a.Close()
	b := New[string](rdb, WithLogger(nil), WithoutNearCache()) // off: adds no logger
	defer b.Close()
	calls := func() {
		for range 20 {
			_, _ = a.GetOrLoad(t.Context(), "k", (&counter{}).load)
			_, _ = b.GetOrLoad(t.Context(), "k", func(context.Context) (string, error) { return "v", nil })
		}
	}
	calls()
	assert.Zero(t, logs.count(), "nothing logged while Redis answers")

	srv.Kill()
	calls()
	require.Len(t, logs.lines(slog.LevelError), 1)
	require.NoError(t, srv.Start())
	waitFor(t, func() bool { calls(); return len(logs.lines(slog.LevelInfo)) == 1 })
	assert.Contains(t, logs.lines(slog.LevelInfo)[0], "redis answers again redis="+srv.Addr)
	srv.Kill()
	calls()
	assert.Len(t, logs.lines(slog.LevelError), 2, "a new outage is logged again")
	assert.Zero(t, silent.count(), "nothing went to slog.Default: WithLogger redirects, WithLogger(nil) is off")
}

func TestPingNamesTheAddress(t *testing.T) {
	t.Parallel()
	live := redistest.Addr(t)
	c := New[product](redistest.Client(t, live), WithLogger(nil))
	defer c.Close()
	require.NoError(t, c.Ping(t.Context()))

	dead := deadAddr(t)
	rdb, _ := dialCounter(t, dead)
	d := New[product](rdb, WithLogger(nil))
	defer d.Close()
	err := d.Ping(t.Context())
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "cache: ping redis at "+dead+": dial tcp "+dead), err.Error())

	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": live, "b": dead}, DialTimeout: 200 * time.Millisecond})
	defer ring.Close()
	r := New[product](ring, WithLogger(nil))
	defer r.Close()
	err = r.Ping(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "node "+dead+": dial tcp "+dead, "the failing node is named")
}

// TestLostLockIsNotAnOutage: a release that finds its lock gone got a reply
// from Redis; counted as an outage it opened the breaker and logged Redis as
// unreachable (what made memory pressure, which evicts locks, look like an
// outage).
func TestLostLockIsNotAnOutage(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	logs := &logCapture{}
	c := New[product](rdb, WithCircuitBreaker(1, time.Minute), WithLogger(slog.New(logs)))
	defer c.Close()
	key := p + "k"
	_, err := c.GetOrLoad(t.Context(), key, func(ctx context.Context) (product, error) {
		require.NoError(t, rdb.Del(ctx, LockKey(key)).Err()) // evicted, or voided by a Delete
		return product{}, assert.AnError
	})
	require.ErrorIs(t, err, assert.AnError)
	assert.False(t, c.brk.Open(), "a lost lock opened the breaker")
	assert.Zero(t, logs.count(), "a lost lock was logged as an outage: %q", logs.lines(slog.LevelError))
}
