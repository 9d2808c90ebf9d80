package cache

import (
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
