// This file proves the lock's events against a real Redis: each fires
// exactly when it should (counted), a loss is reported once per
// acquisition, observers chain, and a panicking observer breaks nothing.

package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder keeps the events it observes. Safe for concurrent use.
type recorder struct {
	mu     sync.Mutex // protects events
	events []Event
}

func (r *recorder) observe(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) option() Option { return WithObserver(r.observe) }

// all is a copy of the events so far.
func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// kinds is the kinds of the events so far, in order.
func (r *recorder) kinds() []EventKind {
	var ks []EventKind
	for _, e := range r.all() {
		ks = append(ks, e.Kind)
	}
	return ks
}

// TestObserverObtain: every Obtain that reaches Redis reports one event,
// EventObtained or EventNotObtained, with the attempts it made; a call
// with an invalid argument reports none.
func TestObserverObtain(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	tests := []struct {
		name     string
		held     bool // another holder has the key when the call begins
		obtain   func(ctx context.Context, rdb *redis.Client, key string, holder *Lock, obs Option) (*Lock, error)
		kind     EventKind // 0: no event
		attempts int
		wantErr  error // what the event's Err wraps (nil: none)
	}{
		{"free", false, func(ctx context.Context, rdb *redis.Client, key string, _ *Lock, obs Option) (*Lock, error) {
			return Obtain(ctx, rdb, key, ttl, obs)
		}, EventObtained, 1, nil},
		{"held, no retry", true, func(ctx context.Context, rdb *redis.Client, key string, _ *Lock, obs Option) (*Lock, error) {
			return Obtain(ctx, rdb, key, ttl, obs)
		}, EventNotObtained, 1, ErrNotObtained},
		{"held through 3 retries", true, func(ctx context.Context, rdb *redis.Client, key string, _ *Lock, obs Option) (*Lock, error) {
			return Obtain(ctx, rdb, key, ttl, obs, WithRetry(LimitRetry(LinearBackoff(time.Millisecond), 3)))
		}, EventNotObtained, 4, ErrNotObtained},
		{"released during the first wait", true, func(ctx context.Context, rdb *redis.Client, key string, holder *Lock, obs Option) (*Lock, error) {
			return Obtain(ctx, rdb, key, ttl, obs, WithRetry(RetryFunc(func(n int) (time.Duration, bool) {
				if n == 1 {
					_ = holder.Release(ctx)
				}
				return time.Millisecond, n < 100
			})))
		}, EventObtained, 2, nil},
		{"context ended before", false, func(ctx context.Context, rdb *redis.Client, key string, _ *Lock, obs Option) (*Lock, error) {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return Obtain(ctx, rdb, key, ttl, obs)
		}, EventNotObtained, 0, context.Canceled},
		{"invalid key", false, func(ctx context.Context, rdb *redis.Client, _ string, _ *Lock, obs Option) (*Lock, error) {
			return Obtain(ctx, rdb, "", ttl, obs)
		}, 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rdb, p := setup(t)
			key := p + "k"
			var holder *Lock
			if tt.held {
				var err error
				holder, err = Obtain(t.Context(), rdb, key, ttl)
				require.NoError(t, err)
			}
			var rec recorder
			l, _ := tt.obtain(t.Context(), rdb, key, holder, rec.option())
			events := rec.all()
			if tt.kind == 0 {
				assert.Empty(t, events)
				return
			}
			require.Len(t, events, 1)
			e := events[0]
			assert.Equal(t, tt.kind, e.Kind)
			assert.Equal(t, key, e.Key)
			assert.Equal(t, tt.attempts, e.Attempts)
			assert.Positive(t, e.Duration)
			assert.Equal(t, l.Fence(), e.Fence)
			if tt.wantErr == nil {
				assert.NoError(t, e.Err)
			} else {
				assert.ErrorIs(t, e.Err, tt.wantErr)
			}
		})
	}
}

// TestObserverObtainRedisError: an Obtain that a Redis error ends (here a
// fencing counter that is not an integer) reports EventNotObtained with
// that error, not ErrNotObtained.
func TestObserverObtainRedisError(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "broken"
	require.NoError(t, rdb.Set(t.Context(), fenceKey(key), "not a number", 0).Err())
	var rec recorder
	_, err := Obtain(t.Context(), rdb, key, time.Minute, rec.option())
	require.Error(t, err)
	events := rec.all()
	require.Len(t, events, 1)
	assert.Equal(t, EventNotObtained, events[0].Kind)
	assert.Equal(t, 1, events[0].Attempts)
	assert.Equal(t, err, events[0].Err)
	assert.NotErrorIs(t, events[0].Err, ErrNotObtained)
}

// TestObserverObtainQuorum: a quorum lock reports its acquisition, with no
// fence, and a loss found at its renewal.
func TestObserverObtainQuorum(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	masters, clients := quorumOf3(t, p)
	key := p + "invoice-run"
	var rec recorder
	l, err := ObtainQuorum(t.Context(), masters, key, 10*time.Second, rec.option())
	require.NoError(t, err)
	for _, c := range clients {
		require.NoError(t, c.Del(t.Context(), key).Err())
	}
	require.ErrorIs(t, l.Refresh(t.Context(), 10*time.Second), ErrNotHeld)
	require.ErrorIs(t, l.Release(t.Context()), ErrNotHeld)
	assert.Equal(t, []EventKind{EventObtained, EventLost}, rec.kinds())
	e := rec.all()[0]
	assert.Equal(t, 1, e.Attempts)
	assert.Zero(t, e.Fence)
}

// TestObserverLosses: a lock found lost is reported once, by the first call
// that finds it (a renewal, TTL or Release), and a lock released is never
// reported lost, whatever is called on it after.
func TestObserverLosses(t *testing.T) {
	t.Parallel()
	gone := func(ctx context.Context, rdb *redis.Client, key string) error { return rdb.Del(ctx, key).Err() }
	takenOver := func(ctx context.Context, rdb *redis.Client, key string) error {
		return rdb.Set(ctx, key, "another holder", time.Minute).Err()
	}
	refresh := func(ctx context.Context, l *Lock) error { return l.Refresh(ctx, time.Minute) }
	ttl := func(ctx context.Context, l *Lock) error { _, err := l.TTL(ctx); return err }
	release := func(ctx context.Context, l *Lock) error { return l.Release(ctx) }
	tests := []struct {
		name  string
		lose  func(ctx context.Context, rdb *redis.Client, key string) error // nil: the lock stays ours
		calls []func(ctx context.Context, l *Lock) error
		want  []EventKind
	}{
		{"found at Refresh", gone, []func(context.Context, *Lock) error{refresh, refresh, ttl, release, release},
			[]EventKind{EventObtained, EventLost}},
		{"found at TTL", takenOver, []func(context.Context, *Lock) error{ttl, ttl, release},
			[]EventKind{EventObtained, EventLost}},
		{"found at Release", gone, []func(context.Context, *Lock) error{release, release, refresh, ttl},
			[]EventKind{EventObtained, EventLostAtRelease}},
		{"taken over, found at Release", takenOver, []func(context.Context, *Lock) error{release},
			[]EventKind{EventObtained, EventLostAtRelease}},
		{"released", nil, []func(context.Context, *Lock) error{release, release, refresh, ttl},
			[]EventKind{EventObtained}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rdb, p := setup(t)
			key := p + "k"
			var rec recorder
			l, err := Obtain(t.Context(), rdb, key, time.Minute, rec.option())
			require.NoError(t, err)
			if tt.lose != nil {
				require.NoError(t, tt.lose(t.Context(), rdb, key))
			}
			for _, call := range tt.calls {
				_ = call(t.Context(), l)
			}
			assert.Equal(t, tt.want, rec.kinds())
			for _, e := range rec.all()[1:] {
				assert.ErrorIs(t, e.Err, ErrNotHeld)
				assert.Equal(t, key, e.Key)
				assert.Equal(t, l.Fence(), e.Fence)
			}
		})
	}
}

// TestObserverHoldLosses: under Do, a lock lost while the work runs is
// reported once, when the watchdog finds it: by the renewal that Redis
// answers "not ours" (and not again by Do's Release), or, while renewals
// hang, when the lease runs out (Err: ErrLost).
func TestObserverHoldLosses(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	waitForCancel := func(ctx context.Context) error { <-ctx.Done(); return nil }

	t.Run("renewal finds it", func(t *testing.T) {
		t.Parallel()
		rdb, p := setup(t)
		key := p + "k"
		var rec recorder
		err := Do(t.Context(), rdb, key, ttl, func(ctx context.Context) error {
			require.NoError(t, rdb.Del(ctx, key).Err())
			return waitForCancel(ctx)
		}, rec.option())
		require.ErrorIs(t, err, ErrLost)
		assert.Equal(t, []EventKind{EventObtained, EventLost}, rec.kinds())
		assert.ErrorIs(t, rec.all()[1].Err, ErrNotHeld)
	})

	t.Run("lease runs out", func(t *testing.T) {
		t.Parallel()
		_, p := setup(t)
		f := newRefreshFault(t)
		f.stall.Store(true)
		rdb := faulty(t, f)
		var rec recorder
		l, err := Obtain(t.Context(), rdb, p+"k", ttl, rec.option())
		require.NoError(t, err)
		require.ErrorIs(t, l.Hold(t.Context(), waitForCancel), ErrLost)
		assert.Equal(t, []EventKind{EventObtained, EventLost}, rec.kinds())
		assert.ErrorIs(t, rec.all()[1].Err, ErrLost)
	})
}

// TestObserverFenceRefused: each refusal the application reports is an
// event with the refused fence; FenceRefused is safe on a nil Lock and on
// one without observers.
func TestObserverFenceRefused(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var rec recorder
	l, err := Obtain(t.Context(), rdb, p+"stock:sku-1", time.Minute, rec.option())
	require.NoError(t, err)
	l.FenceRefused()
	l.FenceRefused()
	assert.Equal(t, []EventKind{EventObtained, EventFenceRefused, EventFenceRefused}, rec.kinds())
	for _, e := range rec.all() {
		assert.Equal(t, l.Fence(), e.Fence)
	}
	var none *Lock
	none.FenceRefused()
	plain, err := Obtain(t.Context(), rdb, p+"plain", time.Minute)
	require.NoError(t, err)
	plain.FenceRefused()
}

// TestObserverChainsAndSurvivesPanics: observers given more than once all
// get every event, in order, even when one before them panics, on the
// caller's goroutine (Obtain) as on the watchdog's (Hold), and the lock
// works as if the panicking one had returned.
func TestObserverChainsAndSurvivesPanics(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	var panicked atomic.Int64
	var rec recorder
	err := Do(t.Context(), rdb, key, 300*time.Millisecond, func(ctx context.Context) error {
		require.NoError(t, rdb.Del(ctx, key).Err())
		<-ctx.Done()
		return nil
	},
		WithObserver(func(e Event) { note("first " + e.Kind.String()) }),
		WithObserver(nil), // ignored
		WithObserver(func(e Event) { panicked.Add(1); panic("observer broke") }),
		WithObserver(func(e Event) { note("last " + e.Kind.String()) }),
		rec.option())
	require.ErrorIs(t, err, ErrLost, "the watchdog, whose observer panicked, must still cancel the work")
	assert.Equal(t, []EventKind{EventObtained, EventLost}, rec.kinds())
	assert.Equal(t, int64(2), panicked.Load())
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"first obtained", "last obtained", "first lost", "last lost"}, order)
}

func TestEventKindString(t *testing.T) {
	t.Parallel()
	for k, want := range map[EventKind]string{
		EventObtained: "obtained", EventNotObtained: "not_obtained", EventLost: "lost",
		EventLostAtRelease: "lost_at_release", EventFenceRefused: "fence_refused", 0: "unknown", 99: "unknown",
	} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d).String() = %q; want %q", k, got, want)
		}
	}
}
