// This file tests New and Ping: the warning of a client the library
// cannot bound, FailOpen with the bounded client when Redis hangs, and the
// readiness check.

package cache

import (
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewWarnsOfAnUnboundedClient: a client whose calls outlive their
// context's deadline is named once, with the options to set; a bounded
// one is not.
func TestNewWarnsOfAnUnboundedClient(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	logs := &logCapture{}
	unbounded := redis.NewClient(&redis.Options{Addr: addr})
	defer unbounded.Close()
	for range 3 {
		c := New[product](unbounded, WithLogger(slog.New(logs)), WithoutNearCache())
		defer c.Close()
	}
	s := New[string](unbounded, WithLogger(slog.New(logs)), WithPrefix("other:"), WithoutNearCache())
	defer s.Close()
	lines := logs.lines(slog.LevelWarn)
	require.Len(t, lines, 1, "once per client: %q", lines)
	for _, want := range []string{"ContextTimeoutEnabled: true", "ReadTimeout", "WriteTimeout", "redis.Options", "redis=" + addr} {
		assert.Contains(t, lines[0], want)
	}

	quiet := &logCapture{}
	bounded := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	defer bounded.Close()
	c := New[product](bounded, WithLogger(slog.New(quiet)))
	defer c.Close()
	_, err := c.GetOrLoad(t.Context(), redistest.Prefix(t, bounded)+"k", (&counter{}).load)
	require.NoError(t, err)
	for _, l := range quiet.lines(slog.LevelWarn) {
		assert.False(t, strings.Contains(l, "ContextTimeoutEnabled"), "a bounded client warned: %q", l)
	}
}

// TestHungRedisFailsOpenWithTheBoundedClient: with the client the Quick
// start builds (ContextTimeoutEnabled, short timeouts), a frozen Redis
// still lets FailOpen load every call, near cache on.
func TestHungRedisFailsOpenWithTheBoundedClient(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it freezes the server")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	c := New[product](rdb, WithLoadTimeout(2*time.Second), WithTags())
	defer c.Close()
	src := &counter{}
	_, err := c.GetOrLoad(t.Context(), "warm", src.load)
	require.NoError(t, err)

	require.NoError(t, srv.Process().Signal(syscall.SIGSTOP))
	defer func() { _ = srv.Process().Signal(syscall.SIGCONT) }()
	before := src.calls.Load()
	for i := range 5 {
		_, err := c.GetOrLoad(t.Context(), "cold"+string(rune('a'+i)), src.load)
		require.NoError(t, err, "call %d", i)
	}
	assert.Equal(t, before+5, src.calls.Load(), "FailOpen loaded each call")
}

// TestPingReportsAnUnreachableRedis: Ping is nil while Redis answers and an
// error naming the address when it does not (internal/health tests the
// messages for every client kind).
func TestPingReportsAnUnreachableRedis(t *testing.T) {
	t.Parallel()
	c := New[product](redistest.Client(t, redistest.Addr(t)), WithLogger(nil))
	defer c.Close()
	require.NoError(t, c.Ping(t.Context()))

	dead := deadAddr(t)
	rdb, _ := dialCounter(t, dead)
	d := New[product](rdb, WithLogger(nil))
	defer d.Close()
	err := d.Ping(t.Context())
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "cache: ping redis at "+dead+": dial tcp "+dead), err.Error())
}
