// This file checks the errors the calls return: none of their work for
// a context already ended, one line each, the key named once, and the same
// not-found on every path.

package cache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// total is how many commands cc has counted.
func (c *cmdCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

func TestEndedContextDoesNoWork(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	cmds := countCommands(rdb)
	c := New[product](rdb, WithoutNearCache()) // counts every command the client sends
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	expired, cancel2 := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"cancelled", cancelled, context.Canceled},
		{"past its deadline", expired, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &counter{}
			many := func(ctx context.Context, keys []string) (map[string]product, error) {
				v, err := src.load(ctx)
				return map[string]product{keys[0]: v}, err
			}
			key := p + strings.ReplaceAll(tc.name, " ", "-")
			before := cmds.total()
			_, err := c.GetOrLoad(tc.ctx, key, src.load)
			assert.ErrorIs(t, err, tc.want, "GetOrLoad")
			_, err = c.GetOrLoadMany(tc.ctx, []string{key + "-many"}, many)
			assert.ErrorIs(t, err, tc.want, "GetOrLoadMany")
			_, err = c.Get(tc.ctx, key)
			assert.ErrorIs(t, err, tc.want, "Get")
			assert.ErrorIs(t, c.Set(tc.ctx, key+"-set", product{ID: "x"}), tc.want, "Set")
			assert.ErrorIs(t, c.Delete(tc.ctx, key), tc.want, "Delete")
			// Room for work the calls might have left running in the
			// background (a flight, a batch): a bound on nothing happening,
			// not a speed.
			time.Sleep(100 * time.Millisecond)
			assert.Equal(t, 0, cmds.total()-before, "Redis commands sent for calls whose ctx had ended")
			assert.Equal(t, int64(0), src.calls.Load(), "loads for calls whose ctx had ended")
			assert.Zero(t, rdb.Exists(t.Context(), key, key+"-many", key+"-set").Val(), "nothing stored")
		})
	}
}

// assertOneLine checks that err is one line, without a "cache: " within
// another's message, that names each of keys once.
func assertOneLine(t *testing.T, err error, keys ...string) {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	assert.NotContains(t, msg, "\n", "one line: %q", msg)
	assert.NotContains(t, msg, ": cache: ", "the package's prefix said once per error: %q", msg)
	for _, k := range keys {
		assert.Equal(t, 1, strings.Count(msg, strconv.Quote(k)), "%q named once: %q", k, msg)
	}
}

func TestErrorsAreOneLineAndNameTheKeyOnce(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithLoadTimeout(300*time.Millisecond), WithRetry(1000, 20*time.Millisecond))
	held := []string{p + "held-a", p + "held-b"}
	for _, k := range held { // another process is loading them, and never finishes within the test
		require.NoError(t, rdb.Set(t.Context(), LockKey(k), "someone-else", time.Minute).Err())
	}

	t.Run("wait ended by the load timeout", func(t *testing.T) {
		_, err := c.GetOrLoad(t.Context(), held[0], (&counter{}).load)
		assertOneLine(t, err, held[0])
		assert.ErrorIs(t, err, ErrLockNotAcquired)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("batch", func(t *testing.T) {
		got, err := c.GetOrLoadMany(t.Context(), held, func(_ context.Context, keys []string) (map[string]product, error) {
			return nil, fmt.Errorf("no load expected, got %q", keys)
		})
		assert.Empty(t, got)
		assertOneLine(t, err, held...)
		assert.ErrorIs(t, err, ErrLockNotAcquired)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("batch loader error", func(t *testing.T) {
		boom := errors.New("db down")
		keys := []string{p + "x", p + "y"}
		_, err := c.GetOrLoadMany(t.Context(), keys, func(context.Context, []string) (map[string]product, error) { return nil, boom })
		assertOneLine(t, err, keys...)
		assert.ErrorIs(t, err, boom)
	})
	t.Run("empty key in a batch", func(t *testing.T) {
		_, err := c.GetOrLoadMany(t.Context(), []string{p + "ok", ""}, func(context.Context, []string) (map[string]product, error) { return nil, nil })
		assert.ErrorIs(t, err, ErrEmptyKey)
		assert.EqualError(t, err, "cache: GetOrLoadMany: keys[1]: empty key")
	})
}

func TestNotFoundIsTheSameErrorOnEveryCall(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	key := p + "missing"
	src := &counter{}
	missing := func(context.Context) (product, error) {
		src.calls.Add(1)
		return product{}, fmt.Errorf("product 7: %w", ErrNotFound)
	}
	want := `cache: not found: "` + key + `"`
	_, first := c.GetOrLoad(t.Context(), key, missing)  // loaded
	_, second := c.GetOrLoad(t.Context(), key, missing) // the cached not-found
	_, get := c.Get(t.Context(), key)
	for name, err := range map[string]error{"first GetOrLoad": first, "second GetOrLoad": second, "Get": get} {
		assert.ErrorIs(t, err, ErrNotFound, name)
		assert.EqualError(t, err, want, name)
	}
	assert.Equal(t, int64(1), src.calls.Load(), "the not-found is cached")

	// Not cached (a loader's DoNotCache): the same error.
	_, err := c.GetOrLoad(t.Context(), p+"volatile", func(ctx context.Context) (product, error) {
		DoNotCache(ctx)
		return product{}, fmt.Errorf("product 8: %w", ErrNotFound)
	})
	assert.EqualError(t, err, `cache: not found: "`+p+`volatile"`)
}
