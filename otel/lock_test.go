// This file runs real lock operations against the test Redis and reads the
// lock.* figures back through the SDK's manual reader.

package cacheotel_test

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/lock"
	cacheotel "github.com/stampede-go/stampede/otel"
	"go.opentelemetry.io/otel/attribute"
)

func lockName(n string) attribute.KeyValue    { return cacheotel.KeyLockName.String(n) }
func lockOutcome(o string) attribute.KeyValue { return cacheotel.KeyLockOutcome.String(o) }
func lostAt(w string) attribute.KeyValue      { return cacheotel.KeyLockLostAt.String(w) }

// runLockJobs takes locks under prefix p with opt: two acquisitions, a
// give-up after 2 retries, a Redis error, a loss found at a renewal, one at
// Release, and a fence refusal.
func runLockJobs(t *testing.T, rdb *redis.Client, p string, opt lock.Option) {
	t.Helper()
	ctx := t.Context()
	a, err := lock.Obtain(ctx, rdb, p+"a", time.Minute, opt)
	if err != nil {
		t.Fatalf("Obtain a: %v", err)
	}
	if _, err := lock.Obtain(ctx, rdb, p+"a", time.Minute, opt, lock.WithRetry(lock.LimitRetry(lock.LinearBackoff(time.Millisecond), 2))); err == nil {
		t.Fatal("a second Obtain of a held lock succeeded")
	}
	a.FenceRefused()
	rdb.Del(ctx, p+"a")
	if err := a.Refresh(ctx, time.Minute); err == nil {
		t.Fatal("Refresh of a deleted lock succeeded")
	}
	_ = a.Release(ctx) // the loss was reported by Refresh
	b, err := lock.Obtain(ctx, rdb, p+"b", time.Minute, opt)
	if err != nil {
		t.Fatalf("Obtain b: %v", err)
	}
	rdb.Del(ctx, p+"b")
	_ = b.Release(ctx)
	c, err := lock.Obtain(ctx, rdb, p+"c", time.Minute) // not observed: to learn its fencing counter's key
	if err != nil {
		t.Fatalf("Obtain c: %v", err)
	}
	_ = c.Release(ctx)
	rdb.Set(ctx, c.FenceKey(), "not a number", 0)
	if _, err := lock.Obtain(ctx, rdb, p+"c", time.Minute, opt); err == nil {
		t.Fatal("Obtain with a broken fencing counter succeeded")
	}
}

// TestLockObserver: the lock operations of runLockJobs, each recorded once
// under its outcome, with the job's name and never the key.
func TestLockObserver(t *testing.T) {
	rdb, p := setup(t)
	m := newMeter(t)
	obs, err := cacheotel.LockObserver("invoices", cacheotel.WithMeterProvider(m.provider))
	if err != nil {
		t.Fatalf("LockObserver: %v", err)
	}
	runLockJobs(t, rdb, p, lock.WithObserver(obs))

	points := m.collect(t)
	want := []string{"lock.attempts", "lock.fence.refusals", "lock.losses", "lock.wait.duration"}
	if got := names(points); !slices.Equal(got, want) {
		t.Errorf("metrics %v; want %v", got, want)
	}
	for _, w := range []struct {
		outcome  string
		calls    uint64
		attempts int64
	}{{"obtained", 2, 2}, {"not_obtained", 1, 3}, {"error", 1, 1}} {
		if n, sum := histogram(points, "lock.wait.duration", lockName("invoices"), lockOutcome(w.outcome)); n != w.calls || sum <= 0 {
			t.Errorf("lock.wait.duration{%s} = count %d, sum %gs; want count %d, sum > 0", w.outcome, n, sum, w.calls)
		}
		if got := counter(points, "lock.attempts", lockName("invoices"), lockOutcome(w.outcome)); got != w.attempts {
			t.Errorf("lock.attempts{%s} = %d; want %d", w.outcome, got, w.attempts)
		}
	}
	for _, where := range []string{"held", "release"} {
		if got := counter(points, "lock.losses", lockName("invoices"), lostAt(where)); got != 1 {
			t.Errorf("lock.losses{%s} = %d; want 1", where, got)
		}
	}
	if got := counter(points, "lock.fence.refusals", lockName("invoices")); got != 1 {
		t.Errorf("lock.fence.refusals = %d; want 1", got)
	}
	noKey(t, points, p)
}

// TestLockObserverEachKind feeds one event of each kind and checks the data
// points it makes; an unknown kind makes none, and an empty name is an
// error.
func TestLockObserverEachKind(t *testing.T) {
	tests := []struct {
		event   lock.Event
		metrics []string
		attrs   []attribute.KeyValue
	}{
		{lock.Event{Kind: lock.EventObtained, Duration: time.Second, Attempts: 2}, []string{"lock.attempts", "lock.wait.duration"}, []attribute.KeyValue{lockOutcome("obtained")}},
		{lock.Event{Kind: lock.EventNotObtained, Duration: time.Second, Attempts: 2, Err: lock.ErrNotObtained}, []string{"lock.attempts", "lock.wait.duration"}, []attribute.KeyValue{lockOutcome("not_obtained")}},
		{lock.Event{Kind: lock.EventLost, Err: lock.ErrNotHeld}, []string{"lock.losses"}, []attribute.KeyValue{lostAt("held")}},
		{lock.Event{Kind: lock.EventLostAtRelease, Err: lock.ErrNotHeld}, []string{"lock.losses"}, []attribute.KeyValue{lostAt("release")}},
		{lock.Event{Kind: lock.EventFenceRefused, Fence: 7}, []string{"lock.fence.refusals"}, nil},
		{lock.Event{Kind: 0}, nil, nil},
		{lock.Event{Kind: 200}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.event.Kind.String(), func(t *testing.T) {
			m := newMeter(t)
			obs, err := cacheotel.LockObserver("jobs", cacheotel.WithMeterProvider(m.provider), cacheotel.WithAttributes(attribute.String("region", "eu")))
			if err != nil {
				t.Fatal(err)
			}
			tt.event.Key = "secret-key-42"
			obs(tt.event)
			points := m.collect(t)
			if got := names(points); !slices.Equal(got, tt.metrics) {
				t.Fatalf("metrics %v; want %v", got, tt.metrics)
			}
			want := attribute.NewSet(append([]attribute.KeyValue{lockName("jobs"), attribute.String("region", "eu")}, tt.attrs...)...)
			for _, p := range points {
				if !p.attrs.Equals(&want) {
					t.Errorf("%s has attributes %v; want %v", p.metric, p.attrs.ToSlice(), want.ToSlice())
				}
			}
			noKey(t, points, "secret-key-42")
		})
	}
	if _, err := cacheotel.LockObserver("", cacheotel.WithMeterProvider(newMeter(t).provider)); err == nil {
		t.Error(`LockObserver("") returned no error`)
	}
}
