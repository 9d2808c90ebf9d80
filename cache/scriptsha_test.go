package cache

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wireCounter is a go-redis hook that counts, per command name, the
// commands sent and the bytes of their arguments.
type wireCounter struct {
	mu    sync.Mutex
	n     map[string]int
	bytes int
}

func countWire(rdb *redis.Client) *wireCounter {
	w := &wireCounter{n: map[string]int{}}
	rdb.AddHook(w)
	return w
}

func (w *wireCounter) add(cmds ...redis.Cmder) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, cmd := range cmds {
		w.n[cmd.Name()]++
		for _, a := range cmd.Args() {
			switch a := a.(type) {
			case string:
				w.bytes += len(a)
			case []byte:
				w.bytes += len(a)
			default:
				w.bytes += len(fmt.Sprint(a))
			}
		}
	}
}

// take returns the counts since the last take and resets them.
func (w *wireCounter) take() (n map[string]int, bytes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, bytes = w.n, w.bytes
	w.n, w.bytes = map[string]int{}, 0
	return n, bytes
}

func (w *wireCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *wireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { w.add(cmd); return next(ctx, cmd) }
}
func (w *wireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { w.add(cmds...); return next(ctx, cmds) }
}

// TestScriptsRunByHash: once Redis has the scripts, a Set, a Delete, a
// DeleteByTag, an Expire and a GetOrLoadMany send no EVAL (every script by
// its SHA, in the confirmation's pipeline too), with the near cache on.
func TestScriptsRunByHash(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	wire := countWire(rdb)
	c := New[product](rdb, WithPrefix(p), WithTags(), WithStale(time.Minute))
	defer c.Close()
	ctx := t.Context()
	keys := []string{"a", "b", "c", "d"}
	src := &source{}
	run := func() {
		require.NoError(t, c.Set(ctx, "k", product{ID: "1"}, Tags("t")))
		require.NoError(t, c.Expire(ctx, "k"))
		require.NoError(t, c.Delete(ctx, "k"))
		require.NoError(t, c.DeleteByTag(ctx, "t"))
		_, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
		require.NoError(t, err)
		require.NoError(t, c.Delete(ctx, keys...))
	}
	run() // the scripts are in Redis after this
	wire.take()
	require.NoError(t, c.Set(ctx, "k", product{ID: "1"}, Tags("t")))
	n, setBytes := wire.take()
	assert.Zero(t, n["eval"], "Set: %v", n)
	t.Logf("one Set sent %d argument bytes: %v", setBytes, n)
	_, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
	require.NoError(t, err)
	n, manyBytes := wire.take()
	assert.Zero(t, n["eval"], "GetOrLoadMany: %v", n)
	t.Logf("one GetOrLoadMany of %d misses sent %d argument bytes: %v", len(keys), manyBytes, n)
	require.NoError(t, c.Delete(ctx, keys...))
	run()
	n, _ = wire.take()
	assert.Zero(t, n["eval"], "%v", n)
	assert.Less(t, setBytes, 1500, "a Set sends the value and the keys, not the scripts")
}

// TestScriptFlushBetweenCalls: a SCRIPT FLUSH between calls costs the next
// of each kind one NOSCRIPT and a reload, never a failure.
func TestScriptFlushBetweenCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it empties the server's script cache")
	rdb := redistest.Client(t, srv.Addr)
	wire := countWire(rdb)
	c := New[product](rdb, WithTags(), WithStale(time.Minute))
	defer c.Close()
	ctx := t.Context()
	keys := []string{"a", "b", "c"}
	src := &source{}
	load := &counter{}
	for round := range 3 {
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		v := product{ID: fmt.Sprint(round)}
		require.NoError(t, c.Set(ctx, "k", v, Tags("t")))
		got, err := c.GetOrLoad(ctx, "k", load.load)
		require.NoError(t, err)
		assert.Equal(t, v, got, "round %d", round)
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		require.NoError(t, c.Expire(ctx, "k"))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		require.NoError(t, c.DeleteByTag(ctx, "t"))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		many, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
		require.NoError(t, err)
		assert.Len(t, many, len(keys))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		require.NoError(t, c.Delete(ctx, keys...))
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		_, err = c.GetOrLoad(ctx, "k", load.load) // removed by the tag: loaded
		require.NoError(t, err)
	}
	n, _ := wire.take()
	assert.Positive(t, n["evalsha"])
	t.Logf("commands: %v", n)
}
