package cache

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pauseAfterGet holds the reply of a GET of key, once armed, until resume
// is closed: what a caller does between that read and its next command
// happens meanwhile.
type pauseAfterGet struct {
	key     string
	armed   *atomic.Bool
	paused  chan struct{}
	resume  chan struct{}
	tripped *atomic.Bool
}

func (h pauseAfterGet) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h pauseAfterGet) hold(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		a := cmd.Args()
		if h.armed.Load() && cmd.Name() == "get" && len(a) > 1 && a[1] == h.key && h.tripped.CompareAndSwap(false, true) {
			close(h.paused)
			<-h.resume
			return
		}
	}
}

func (h pauseAfterGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.hold(cmd)
		return err
	}
}

func (h pauseAfterGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.hold(cmds...)
		return err
	}
}

// Expire voids a load in flight whose commit lands between Expire's read
// of the value and its rewrite: that load read the source before Expire
// was called, so callers that begin after Expire returned must not get it.
func TestExpireVoidsALoadCommittedBetweenItsReadAndItsRewrite(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	loader := New[product](rdb, WithPrefix(p), WithStale(time.Hour))
	t.Cleanup(func() { loader.Close() })
	hook := pauseAfterGet{key: p + "k", armed: &atomic.Bool{}, tripped: &atomic.Bool{}, paused: make(chan struct{}), resume: make(chan struct{})}
	wrdb := redistest.Client(t, redistest.Addr(t))
	wrdb.AddHook(hook)
	writer := New[product](wrdb, WithPrefix(p), WithStale(time.Hour))
	t.Cleanup(func() { writer.Close() })

	require.NoError(t, loader.Set(t.Context(), "k", product{ID: "v0"}))
	loading, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() { // a reload under the lock, as a refresh or ForceRefresh does
		_, err := loader.GetOrLoad(context.Background(), "k", func(context.Context) (product, error) {
			close(loading)
			<-release // read the source before Expire was called
			return product{ID: "old"}, nil
		}, ForceRefresh())
		done <- err
	}()
	<-loading
	hook.armed.Store(true)
	expired := make(chan error, 1)
	go func() { expired <- writer.Expire(context.Background(), "k") }()
	<-hook.paused // Expire has read v0
	close(release)
	require.NoError(t, <-done) // the load committed "old"
	close(hook.resume)
	require.NoError(t, <-expired)

	v, err := writer.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: "new"}, nil })
	require.NoError(t, err)
	assert.Equal(t, "new", v.ID, "GetOrLoad after Expire returned got what a load read before Expire was called")
}

// A value kept in memory is a value found: a GetOrLoad with Tags it lacks
// reloads it as it would from Redis, so that DeleteByTag of those tags
// removes what the call returned.
func TestNearHitWithoutTheCallsTagsIsReloaded(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, ev := newNearCache(t, p, WithTags())
	load := func(id string) func(context.Context) (product, error) {
		return func(context.Context) (product, error) { return product{ID: id}, nil }
	}
	require.True(t, eventually(func() bool {
		_, err := c.GetOrLoad(t.Context(), "k", load("a"), Tags("a"))
		require.NoError(t, err)
		return ev.get(EventNearHit) > 0
	}), "the value never came to memory")

	for name, get := range map[string]func() (product, error){
		"GetOrLoad": func() (product, error) { return c.GetOrLoad(t.Context(), "k", load("b"), Tags("b")) },
		"GetOrLoadMany": func() (product, error) {
			m, err := c.GetOrLoadMany(t.Context(), []string{"k"}, func(_ context.Context, keys []string) (map[string]product, error) {
				return map[string]product{"k": {ID: "b"}}, nil
			}, Tags("b"))
			return m["k"], err
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := get()
			require.NoError(t, err)
			require.NoError(t, c.DeleteByTag(t.Context(), "b"))
			v, err := c.GetOrLoad(t.Context(), "k", load("after"))
			require.NoError(t, err)
			assert.Equal(t, "after", v.ID, "DeleteByTag(b) left what %s(Tags(b)) returned", name)
			// back in memory, tagged a only, for the next case
			require.NoError(t, c.Delete(t.Context(), "k"))
			require.True(t, eventually(func() bool {
				before := ev.get(EventNearHit)
				_, err := c.GetOrLoad(t.Context(), "k", load("a"), Tags("a"))
				require.NoError(t, err)
				return ev.get(EventNearHit) > before
			}))
		})
	}
}

// Callers of one key with different tags, in different processes, reload
// it once each at most: the reload keeps the tags it found, so the value
// soon carries every caller's and nobody reloads it again.
func TestCallersWithDifferentTagsStopReloading(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	a := New[product](rdb, WithPrefix(p), WithTags())
	t.Cleanup(func() { a.Close() })
	b := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithTags())
	t.Cleanup(func() { b.Close() })
	var loads atomic.Int64
	load := func(context.Context) (product, error) {
		loads.Add(1)
		return product{ID: "v"}, nil
	}
	for range 10 {
		_, err := a.GetOrLoad(t.Context(), "k", load, Tags("a"))
		require.NoError(t, err)
		_, err = b.GetOrLoad(t.Context(), "k", load, Tags("b"))
		require.NoError(t, err)
		m, err := b.GetOrLoadMany(t.Context(), []string{"k"}, func(_ context.Context, keys []string) (map[string]product, error) {
			loads.Add(1)
			return map[string]product{"k": {ID: "v"}}, nil
		}, Tags("c"))
		require.NoError(t, err)
		require.Equal(t, "v", m["k"].ID)
	}
	assert.Equal(t, int64(3), loads.Load(), "loads for 30 calls with three sets of tags")
}
