// This file checks the errors the calls return: none of their work for
// a context already ended, one line each, the key named once, and the same
// not-found on every path.

package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEndedContextDoesNoWork(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	cmds := redistest.CountCommands(rdb)
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
			before := cmds.Total()
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
			assert.Equal(t, 0, cmds.Total()-before, "Redis commands sent for calls whose ctx had ended")
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

// This file proves that no callback a user passes (codec, observer)
// crashes the process, on the caller's goroutine or on one the cache owns:
// a codec panic comes back as a *PanicError, an observer panic goes to the
// error hook and the call goes on.
// decodePanics encodes as JSON and panics decoding: values get stored, then
// every read of them meets the panic.
type decodePanics struct{}

func (decodePanics) Marshal(v any) ([]byte, error) { return json.Marshal(v) }
func (decodePanics) Unmarshal([]byte, any) error   { panic("codec broke") }

// panics collects what the error hook got.
type panics struct {
	mu   sync.Mutex
	errs []error
}

func (h *panics) hook(_ string, err error) { h.mu.Lock(); h.errs = append(h.errs, err); h.mu.Unlock() }

// observer returns how many errors were *PanicErrors of the observer, and
// how many were anything else.
func (h *panics) observer() (observer, other int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, err := range h.errs {
		var pe *PanicError
		if errors.As(err, &pe) && pe.in == "observer" {
			observer++
		} else {
			other++
		}
	}
	return observer, other
}

func TestCodecPanicsAreErrors(t *testing.T) {
	t.Parallel()
	// Each scenario crashed the process or let the panic escape to the
	// caller before; each must now return *PanicErrors only.
	scenarios := []struct {
		name string
		run  func(t *testing.T, p string) []error
	}{
		{"Get decodes a hit", func(t *testing.T, p string) []error {
			rdb, _ := setup(t)
			_, err := New[product](rdb).GetOrLoad(t.Context(), p+"k", (&counter{}).load)
			require.NoError(t, err)
			_, err = New[product](rdb, WithCodec(decodePanics{})).Get(t.Context(), p+"k")
			return []error{err}
		}},
		{"GetOrLoad decodes a hit", func(t *testing.T, p string) []error {
			rdb, _ := setup(t)
			_, err := New[product](rdb).GetOrLoad(t.Context(), p+"k", (&counter{}).load)
			require.NoError(t, err)
			_, err = New[product](rdb, WithCodec(decodePanics{})).GetOrLoad(t.Context(), p+"k", (&counter{}).load)
			return []error{err}
		}},
		{"GetOrLoad decodes its caller's copy of a load", func(t *testing.T, p string) []error {
			rdb, _ := setup(t)
			_, err := New[product](rdb, WithCodec(decodePanics{})).GetOrLoad(t.Context(), p+"k", (&counter{}).load)
			return []error{err}
		}},
		{"GetOrLoadMany decodes hits concurrently (WithStale, WithSoftLoadTimeout)", func(t *testing.T, p string) []error {
			rdb, _ := setup(t)
			keys := names(p, 3)
			_, err := New[product](rdb).GetOrLoadMany(t.Context(), keys, (&source{}).loadMany)
			require.NoError(t, err)
			c := New[product](rdb, WithCodec(decodePanics{}), WithStale(time.Minute), WithSoftLoadTimeout(50*time.Millisecond))
			_, err = c.GetOrLoadMany(t.Context(), keys, (&source{}).loadMany)
			require.NoError(t, c.Close())
			return unjoin(err)
		}},
		{"GetOrLoadMany waits for another holder, then loads", func(t *testing.T, p string) []error {
			rdb, _ := setup(t)
			key := p + "k"
			require.NoError(t, rdb.Set(t.Context(), LockKey(key), "other", 150*time.Millisecond).Err())
			c := New[product](rdb, WithCodec(decodePanics{}))
			_, err := c.GetOrLoadMany(t.Context(), []string{key}, (&source{}).loadMany)
			return unjoin(err)
		}},
	}
	var panicErrors, others int
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			_, p := setup(t)
			errs := s.run(t, p)
			require.NotEmpty(t, errs, "the codec panicked: the caller must get an error")
			for _, err := range errs {
				var pe *PanicError
				if errors.As(err, &pe) && pe.Value == "codec broke" {
					panicErrors++
				} else {
					others++
					t.Errorf("got %v; want a *PanicError of the codec", err)
				}
			}
		})
	}
	t.Logf("%d scenarios: %d *PanicErrors, %d other errors, 0 crashes", len(scenarios), panicErrors, others)
}

// unjoin returns the errors errors.Join put together (nil: none).
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err != nil {
		return []error{err}
	}
	return nil
}

func TestObserverPanicsGoToTheErrorHook(t *testing.T) {
	t.Parallel()
	// The observer runs on callers' goroutines and on the cache's own: a
	// panic there is recovered, reported once to the error hook, and the call
	// goes on with its result.
	panicOn := func(kind EventKind) func(Event) {
		return func(e Event) {
			if e.Kind == kind {
				panic("observer broke")
			}
		}
	}
	t.Run("load, on the caller's flight", func(t *testing.T) {
		rdb, p := setup(t)
		var h panics
		c := New[product](rdb, WithObserver(panicOn(EventLoad)), WithErrorHook(h.hook))
		v, err := c.GetOrLoad(t.Context(), p+"k", (&counter{}).load)
		require.NoError(t, err)
		assert.Equal(t, "p1", v.ID)
		assert.Zero(t, rdb.Exists(t.Context(), LockKey(p+"k")).Val(), "the lock is released")
		assert.Equal(t, int64(1), rdb.Exists(t.Context(), p+"k").Val(), "the value is stored")
		n, other := h.observer()
		assert.Equal(t, 1, n, "observer panics reported")
		assert.Zero(t, other)
	})
	t.Run("background refresh", func(t *testing.T) {
		rdb, p := setup(t)
		var h panics
		c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
			WithStale(time.Minute), WithObserver(panicOn(EventRefresh)), WithErrorHook(h.hook))
		src := &counter{}
		_, err := c.GetOrLoad(t.Context(), p+"k", src.load)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond) // past the TTL: the next hit refreshes in the background
		_, err = c.GetOrLoad(t.Context(), p+"k", src.load)
		require.NoError(t, err)
		require.NoError(t, c.Close()) // waits for the refresh
		assert.Equal(t, int64(2), src.calls.Load(), "the refresh loaded")
		n, other := h.observer()
		assert.Equal(t, 1, n, "observer panics reported")
		assert.Zero(t, other)
	})
	t.Run("GetOrLoadMany serves stale on goroutines of its own", func(t *testing.T) {
		rdb, p := setup(t)
		var h panics
		c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
			WithStale(time.Minute), WithSoftLoadTimeout(time.Second),
			WithObserver(panicOn(EventStaleServed)), WithErrorHook(h.hook))
		keys := names(p, 3)
		src := &source{}
		_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond) // past the TTL
		failing := func(context.Context, []string) (map[string]product, error) {
			return nil, errors.New("database down") // the refreshes fail: the stale values are served
		}
		got, err := c.GetOrLoadMany(t.Context(), keys, failing)
		require.NoError(t, err)
		assert.Len(t, got, 3, "the stale values")
		require.NoError(t, c.Close())
		n, _ := h.observer() // the hook also hears of the failed refreshes
		assert.Equal(t, 3, n, "observer panics reported, one per stale key")
	})
}

func TestObserversAllGetEventsWhenOnePanics(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var h panics
	var ev eventCounts
	c := New[product](rdb, WithObserver(func(Event) { panic("first observer broke") }), WithObserver(ev.observe), WithErrorHook(h.hook))
	_, err := c.GetOrLoad(t.Context(), p+"k", (&counter{}).load)
	require.NoError(t, err)
	assert.Equal(t, int64(1), ev[EventLoad].Load(), "the second observer still gets the event")
	n, _ := h.observer()
	assert.Equal(t, int(ev[EventMiss].Load()+ev[EventLoad].Load()), n, "one report per event the first observer panicked on")
}
