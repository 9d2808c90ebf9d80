package cache

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Expire voids a load in flight as Delete does, with or without WithStale:
// a load that read the source before Expire returned must not commit what
// it read, or callers that begin after Expire get it without a reload.
func TestExpireVoidsALoadInFlight(t *testing.T) {
	t.Parallel()
	for _, stale := range []bool{false, true} {
		t.Run(map[bool]string{false: "without stale", true: "with stale"}[stale], func(t *testing.T) {
			t.Parallel()
			_, p := setup(t)
			var opts []Option
			if stale {
				opts = append(opts, WithStale(time.Hour))
			}
			loader, _, _ := newNearCache(t, p, opts...) // two processes
			writer, _, _ := newNearCache(t, p, opts...)
			loading, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := loader.GetOrLoad(context.Background(), "k", func(context.Context) (product, error) {
					close(loading)
					<-release // read the source before Expire, returned after
					return product{ID: "old", Price: 1}, nil
				})
				done <- err
			}()
			<-loading
			require.NoError(t, writer.Expire(t.Context(), "k"))
			close(release)
			require.NoError(t, <-done)

			for name, c := range map[string]*Cache[product]{"loader": loader, "writer": writer} {
				v, err := c.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) {
					return product{ID: "new", Price: 2}, nil
				})
				require.NoError(t, err)
				assert.Equal(t, "new", v.ID, "GetOrLoad in the %s's process after Expire returned got the value a voided load read before it", name)
			}
		})
	}
}

// NoStale refuses the fallback of a value expired by hand, as it refuses a
// value stale by its TTL: a failed reload is the loader's error.
func TestNoStaleRefusesTheFallbackOfAnExpiredValue(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, _ := newNearCache(t, p, WithStale(time.Hour))
	_, err := c.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: "old"}, nil })
	require.NoError(t, err)
	require.NoError(t, c.Expire(t.Context(), "k"))
	boom := errors.New("database down")
	failing := func(context.Context) (product, error) { return product{}, boom }

	var info ResultInfo
	v, err := c.GetOrLoad(WithResultInfo(t.Context(), &info), "k", failing, NoStale())
	assert.ErrorIs(t, err, boom, "GetOrLoad(NoStale) = %+v (stale %v); want the loader's error", v, info.Stale)

	info = ResultInfo{}
	v, err = c.GetOrLoad(WithResultInfo(t.Context(), &info), "k", failing)
	require.NoError(t, err, "without NoStale the expired value is the fallback")
	assert.Equal(t, "old", v.ID)
	assert.True(t, info.Stale)
}

// A NoStale caller that joins a flight started by a plain caller, which
// serves a stale value, never gets that value: it waits for the refresh,
// as it would on its own. The plain caller's flight is started by hand and
// held until the NoStale caller has joined it, so that its answer is newer
// than that caller (a race of microseconds otherwise).
func TestNoStaleCallerNeverTakesAnotherFlightsStaleValue(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, _ := newNearCache(t, p, WithStale(time.Hour), WithSoftLoadTimeout(0))
	_, err := c.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: "old"}, nil }, TTL(time.Millisecond))
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // past its TTL: stale

	refreshed := make(chan struct{})
	refresh := func(context.Context) (product, error) {
		<-refreshed
		return product{ID: "new"}, nil
	}
	start := make(chan struct{})
	plainOpts := callOptions{store: storeChoice{ttl: ttlChoice{time.Hour, true}}}
	plain := c.group.DoChan(p+"k", func() (any, error) {
		<-start
		return c.flight(context.Background(), p+"k", refresh, plainOpts)
	})
	type answer struct {
		v     product
		err   error
		stale bool
	}
	strict := make(chan answer, 1)
	go func() {
		var info ResultInfo
		v, err := c.GetOrLoad(WithResultInfo(context.Background(), &info), "k", refresh, NoStale(), TTL(time.Hour))
		strict <- answer{v, err, info.Stale}
	}()
	time.Sleep(50 * time.Millisecond) // let the NoStale caller join the flight
	close(start)
	res := <-plain
	require.NoError(t, res.Err)
	require.True(t, res.Val.(*result[product]).stale, "the plain flight serves the stale value while its refresh runs")
	close(refreshed)
	got := <-strict
	require.NoError(t, got.err)
	assert.Equal(t, "new", got.v.ID, "GetOrLoad(NoStale) = %+v (stale %v); want the refreshed value", got.v, got.stale)
	assert.False(t, got.stale)
}

// A caller's Tags are never lost to another caller's flight or to a value
// stored without them: DeleteByTag of the caller's tag removes what it got.
func TestTagsAreNeverLostToAnotherCallersLoad(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, _ := newNearCache(t, p, WithTags())
	var loads atomic.Int64
	loading, release := make(chan struct{}), make(chan struct{})
	untagged := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(context.Background(), "k", func(context.Context) (product, error) {
			loads.Add(1)
			close(loading)
			<-release
			return product{ID: "untagged"}, nil
		})
		untagged <- err
	}()
	<-loading
	tagged := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(context.Background(), "k", func(context.Context) (product, error) {
			loads.Add(1)
			return product{ID: "tagged"}, nil
		}, Tags("t"))
		tagged <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the tagged caller join the flight
	close(release)
	require.NoError(t, <-untagged)
	require.NoError(t, <-tagged)

	require.NoError(t, c.DeleteByTag(t.Context(), "t"))
	before := loads.Load()
	_, err := c.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) {
		loads.Add(1)
		return product{ID: "after"}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, before+1, loads.Load(), "DeleteByTag(t) left the value a caller with Tags(t) got")
}

// GetOrLoadMany reloads a value expired by hand as GetOrLoad does: with the
// old value as the fallback of a failed reload, and keeping its tags.
func TestGetOrLoadManyReloadsAnExpiredValueAsGetOrLoadDoes(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, _, _ := newNearCache(t, p, WithStale(time.Hour), WithTags())
	load := func(id string) func(context.Context, []string) (map[string]product, error) {
		return func(_ context.Context, keys []string) (map[string]product, error) {
			m := map[string]product{}
			for _, k := range keys {
				m[k] = product{ID: id}
			}
			return m, nil
		}
	}
	_, err := c.GetOrLoadMany(t.Context(), []string{"k"}, load("old"), Tags("t"))
	require.NoError(t, err)
	require.NoError(t, c.Expire(t.Context(), "k"))

	boom := errors.New("database down")
	var info ResultInfo
	m, err := c.GetOrLoadMany(WithResultInfo(t.Context(), &info), []string{"k"}, func(context.Context, []string) (map[string]product, error) {
		return nil, boom
	})
	require.NoError(t, err, "the expired value is the fallback of the failed reload")
	assert.Equal(t, "old", m["k"].ID)
	assert.True(t, info.Stale)

	require.NoError(t, c.Expire(t.Context(), "k"))
	m, err = c.GetOrLoadMany(t.Context(), []string{"k"}, load("reloaded"))
	require.NoError(t, err)
	require.Equal(t, "reloaded", m["k"].ID)
	require.NoError(t, c.DeleteByTag(t.Context(), "t"))
	m, err = c.GetOrLoadMany(t.Context(), []string{"k"}, load("after"))
	require.NoError(t, err)
	assert.Equal(t, "after", m["k"].ID, "the reload after Expire lost the value's tags: DeleteByTag left it")
}

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
