package cache

import (
	"log/slog"
	"strings"
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
