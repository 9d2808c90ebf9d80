// This file causes the logged errors and events with real cache
// operations against the test Redis (a lost lock, an unreachable Redis), and
// feeds each kind of event to the observer for the rest.

package cacheslog_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/cacheslog"
	"github.com/stampede-go/stampede/internal/redistest"
)

// line is one log record, its attributes as text.
type line struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// recorder is a slog.Handler that keeps every record; safe for concurrent use.
type recorder struct {
	mu    sync.Mutex // protects lines
	lines []line
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	l := line{level: rec.Level, msg: rec.Message, attrs: map[string]string{}}
	rec.Attrs(func(a slog.Attr) bool { l.attrs[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	r.lines = append(r.lines, l)
	r.mu.Unlock()
	return nil
}

func (r *recorder) get() []line {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

// deadAddr is a loopback address nothing listens on, nor will.
func deadAddr(t *testing.T) string { return redistest.DeadAddr(t) }

// loseLock runs a GetOrLoad of key on c whose load a Delete overtakes, so
// that the loaded value is not stored.
func loseLock(t *testing.T, c *cache.Cache[string], key string) {
	t.Helper()
	loading, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(context.Background(), key, func(context.Context) (string, error) {
			close(loading)
			<-release
			return "old", nil
		})
		done <- err
	}()
	<-loading
	if err := c.Delete(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("GetOrLoad: %v", err)
	}
}

// TestVoidedLoad: a Delete that wins over a load is by design, not an
// error: neither function logs it.
func TestVoidedLoad(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	p := redistest.Prefix(t, rdb)
	var hook, obs recorder
	c := cache.New[string](rdb, cache.WithPrefix(p),
		cache.WithErrorHook(cacheslog.ErrorHook(slog.New(&hook))),
		cache.WithObserver(cacheslog.Observer(slog.New(&obs))))
	t.Cleanup(func() { _ = c.Close() })
	loseLock(t, c, "k")

	if got := hook.get(); len(got) != 0 {
		t.Errorf("ErrorHook logged %+v; want nothing", got)
	}
	if got := obs.get(); len(got) != 0 {
		t.Errorf("Observer logged %+v; want nothing", got)
	}
}

func TestRedisDown(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = dead.Close() })
	var hook, obs recorder
	c := cache.New[string](dead, cache.WithCircuitBreaker(2, time.Hour),
		cache.WithErrorHook(cacheslog.ErrorHook(slog.New(&hook))),
		cache.WithObserver(cacheslog.Observer(slog.New(&obs))))
	t.Cleanup(func() { _ = c.Close() })
	for range 3 { // two outages open the breaker; the third call skips Redis
		if _, err := c.GetOrLoad(t.Context(), "k", func(context.Context) (string, error) { return "v", nil }); err != nil {
			t.Fatalf("GetOrLoad under FailOpen: %v", err)
		}
	}

	got := obs.get()
	var levels []slog.Level
	var msgs []string
	for _, l := range got {
		levels, msgs = append(levels, l.level), append(msgs, l.msg)
		if l.attrs["key"] != "k" || l.attrs["error"] == "" {
			t.Errorf("Observer logged %q with attributes %v; want key k and an error", l.msg, l.attrs)
		}
	}
	wantMsgs := []string{"cache: redis error", "cache: circuit breaker open", "cache: redis error"}
	if !slices.Equal(msgs, wantMsgs) || slices.ContainsFunc(levels, func(l slog.Level) bool { return l != slog.LevelWarn }) {
		t.Errorf("Observer logged %v at %v; want %v, all at Warn", msgs, levels, wantMsgs)
	}
	// The hook sees the two Redis errors FailOpen absorbed; an open breaker
	// is reported once, by the observer.
	if got := hook.get(); len(got) != 2 || got[0].level != slog.LevelWarn || !strings.Contains(got[0].attrs["error"], "cache: redis:") {
		t.Errorf("ErrorHook logged %+v; want two Warn lines with the Redis error", got)
	}
}

func TestObserverEachKind(t *testing.T) {
	failed := errors.New("failed")
	tests := []struct {
		event cache.Event
		level slog.Level
		msg   string // "" means no line
		err   string // the error attribute, "" for none
	}{
		{cache.Event{Kind: cache.EventHit}, 0, "", ""},
		{cache.Event{Kind: cache.EventMiss}, 0, "", ""},
		{cache.Event{Kind: cache.EventLoad, Err: failed}, 0, "", ""},
		{cache.Event{Kind: cache.EventLockContended}, 0, "", ""},
		{cache.Event{Kind: cache.EventWait, Err: failed}, 0, "", ""},
		{cache.Event{Kind: cache.EventWoken}, 0, "", ""},
		{cache.Event{Kind: cache.EventLockLost, Err: cache.ErrLoadLockLost}, slog.LevelWarn, "cache: lock ran out, value not stored", ""},
		{cache.Event{Kind: cache.EventLoadVoided}, 0, "", ""},
		{cache.Event{Kind: cache.EventStaleServed}, 0, "", ""},
		{cache.Event{Kind: cache.EventStaleServed, Err: failed}, slog.LevelWarn, "cache: stale value served", "failed"},
		{cache.Event{Kind: cache.EventRefresh}, 0, "", ""},
		{cache.Event{Kind: cache.EventRefresh, Err: cache.ErrNotFound}, 0, "", ""},
		{cache.Event{Kind: cache.EventRefresh, Err: failed}, slog.LevelWarn, "cache: refresh failed", "failed"},
		{cache.Event{Kind: cache.EventRedisError, Err: failed}, slog.LevelWarn, "cache: redis error", "failed"},
		{cache.Event{Kind: cache.EventBreakerOpen, Err: failed}, slog.LevelWarn, "cache: circuit breaker open", "failed"},
		{cache.Event{Kind: cache.EventBreakerClose}, slog.LevelInfo, "cache: circuit breaker closed", ""},
		{cache.Event{Kind: 200, Err: failed}, 0, "", ""},
	}
	for _, tt := range tests {
		name := tt.event.Kind.String()
		if tt.event.Err != nil {
			name += "/" + tt.event.Err.Error()
		}
		t.Run(name, func(t *testing.T) {
			var rec recorder
			tt.event.Key = "p:k"
			cacheslog.Observer(slog.New(&rec))(tt.event)
			var want []line
			if tt.msg != "" {
				attrs := map[string]string{"key": "p:k"}
				if tt.err != "" {
					attrs["error"] = tt.err
				}
				want = []line{{tt.level, tt.msg, attrs}}
			}
			if got := rec.get(); !equal(got, want) {
				t.Errorf("logged %+v; want %+v", got, want)
			}
		})
	}
}

// TestDefaultLogger: a nil logger is slog.Default at the time of the call.
func TestDefaultLogger(t *testing.T) {
	hook, obs := cacheslog.ErrorHook(nil), cacheslog.Observer(nil)
	var rec recorder
	prev := slog.Default()
	slog.SetDefault(slog.New(&rec))
	t.Cleanup(func() { slog.SetDefault(prev) })
	hook("k", errors.New("failed"))
	obs(cache.Event{Kind: cache.EventBreakerClose, Key: "k"})
	if got := rec.get(); len(got) != 2 || got[0].level != slog.LevelWarn || got[1].level != slog.LevelInfo {
		t.Errorf("slog.Default got %+v; want a Warn line and an Info line", got)
	}
}

func equal(a, b []line) bool {
	return slices.EqualFunc(a, b, func(x, y line) bool {
		return x.level == y.level && x.msg == y.msg && maps.Equal(x.attrs, y.attrs)
	})
}
