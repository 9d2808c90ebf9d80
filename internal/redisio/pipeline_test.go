// This file tests Pipeline on a single server: every command gets its
// reply, or the pipeline's error when it could not be sent.

package redisio

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
)

func TestPipeline(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	p := redistest.Prefix(t, rdb)
	require.NoError(t, rdb.Set(t.Context(), p+"a", "va", 0).Err())
	ctx := t.Context()
	get := redis.NewStringCmd(ctx, "get", p+"a")
	missing := redis.NewStringCmd(ctx, "get", p+"missing")
	eval := redis.NewCmd(ctx, "eval", "return ARGV[1]", 1, p+"a", "x")
	New(rdb, t.Context, false).Pipeline(ctx, []string{p + "a", p + "missing", p + "a"}, []redis.Cmder{get, missing, eval})
	assert.Equal(t, "va", get.Val())
	assert.ErrorIs(t, missing.Err(), redis.Nil)
	assert.Equal(t, "x", eval.Val())
}

// TestPipelineUnsent: a pipeline that cannot reach Redis gives its error to
// every command.
func TestPipelineUnsent(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	cmds := []redis.Cmder{redis.NewStringCmd(ctx, "get", "k"), redis.NewCmd(ctx, "eval", "return 1", 1, "k")}
	New(rdb, t.Context, false).Pipeline(ctx, []string{"k", "k"}, cmds)
	for _, cmd := range cmds {
		assert.Error(t, cmd.Err(), "%s", cmd.Name())
	}
}
