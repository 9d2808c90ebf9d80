// This file tests EvalMany: calls of several scripts in one round, in
// order, and a script the server does not have yet loaded on the way.

package redisio

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
)

func TestEvalMany(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	p := redistest.Prefix(t, rdb)
	// Sources no server has seen: the test prefix is unique to the run.
	echoSrc := "-- " + p + "\nreturn ARGV[1]"
	keySrc := "-- " + p + "\nreturn KEYS[1]"
	echo, key := redis.NewScript(echoSrc), redis.NewScript(keySrc)
	cl := New(rdb, t.Context, false)
	for _, round := range []string{"first, with NOSCRIPT", "second, loaded"} {
		cmds := cl.EvalMany(t.Context(), echo, echoSrc,
			[]ScriptCall{{Keys: []string{p + "a"}, Args: []any{"1"}}, {Keys: []string{p + "b"}, Args: []any{"2"}}},
			ScriptRun{Script: key, Src: keySrc, Calls: []ScriptCall{{Keys: []string{p + "c"}}}})
		require.Len(t, cmds, 3, round)
		for i, want := range []string{"1", "2", p + "c"} {
			got, err := cmds[i].Text()
			require.NoError(t, err, "%s round: call %d", round, i)
			assert.Equal(t, want, got, "%s round: call %d", round, i)
		}
	}
	loaded, err := rdb.ScriptExists(t.Context(), echo.Hash(), key.Hash()).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true}, loaded, "the scripts were loaded")
	assert.Empty(t, cl.EvalMany(t.Context(), echo, echoSrc, nil), "no calls")
}
