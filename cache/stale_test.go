// This file proves stale serving: a value past its TTL is served at once
// while one refresh runs, and goes on being served while the database fails,
// which is retried once per throttle.

package cache

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/record"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStaleWhileRevalidate(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	var ev eventCounts
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
		WithStale(time.Minute), WithObserver(ev.observe))
	release := make(chan struct{})
	var calls atomic.Int64
	load := func(context.Context) (product, error) {
		if calls.Add(1) > 1 {
			<-release // the refresh blocks until the stale reads are done
		}
		return product{ID: "p1", Price: int(calls.Load())}, nil
	}
	_, err := c.GetOrLoad(t.Context(), key, load)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // past the TTL

	for range 10 {
		var info ResultInfo
		v, err := c.GetOrLoad(WithResultInfo(t.Context(), &info), key, load)
		require.NoError(t, err)
		assert.Equal(t, 1, v.Price, "the stale value is served at once")
		assert.True(t, info.Stale, "the caller can tell it is stale")
	}
	close(release)
	require.NoError(t, c.Close())
	assert.Equal(t, int64(2), calls.Load(), "one refresh for all the stale reads")
	assert.Equal(t, int64(10), ev[EventStaleServed].Load())

	var info ResultInfo
	v, err := c.GetOrLoad(WithResultInfo(t.Context(), &info), key, load)
	require.NoError(t, err)
	assert.Equal(t, 2, v.Price, "the refreshed value is served")
	assert.False(t, info.Stale)
}

func TestStaleIfErrorThrottlesTheFailingDatabase(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	var ev eventCounts
	var hooked atomic.Int64
	const throttle = 200 * time.Millisecond
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
		WithStale(time.Minute), WithStaleThrottle(throttle), WithObserver(ev.observe),
		WithErrorHook(func(string, error) { hooked.Add(1) }))
	var calls atomic.Int64
	dbDown := errors.New("database down")
	load := func(context.Context) (product, error) {
		if calls.Add(1) > 1 {
			return product{}, dbDown
		}
		return product{ID: "p1", Price: 1}, nil
	}
	_, err := c.GetOrLoad(t.Context(), key, load)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)

	start := time.Now()
	served := 0
	for time.Since(start) < 5*throttle {
		v, err := c.GetOrLoad(t.Context(), key, load)
		require.NoError(t, err, "a failing database must not reach callers while a stale value exists")
		require.Equal(t, 1, v.Price)
		served++
		time.Sleep(2 * time.Millisecond)
	}
	require.NoError(t, c.Close())
	attempts := calls.Load() - 1
	periods := int64(time.Since(start)/throttle) + 1
	assert.GreaterOrEqual(t, attempts, int64(3), "the database must be retried after each throttle")
	assert.LessOrEqual(t, attempts, periods, "the database is retried at most once per throttle")
	assert.Equal(t, attempts, hooked.Load(), "each failed refresh goes to the error hook")
	assert.Equal(t, int64(served), ev[EventStaleServed].Load())
}

func TestSoftLoadTimeout(t *testing.T) {
	// Not parallel: the fast refresh must end within the 200 ms soft timeout.
	for _, tc := range []struct {
		name      string
		loadTime  time.Duration
		wantPrice int
		wantStale bool
	}{
		{"fast database: the fresh value", 0, 2, false},
		{"slow database: the stale value", 500 * time.Millisecond, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, p := setup(t)
			key := p + "k"
			c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
				WithStale(time.Minute), WithSoftLoadTimeout(200*time.Millisecond))
			var calls atomic.Int64
			load := func(context.Context) (product, error) {
				if calls.Add(1) > 1 {
					time.Sleep(tc.loadTime)
				}
				return product{ID: "p1", Price: int(calls.Load())}, nil
			}
			_, err := c.GetOrLoad(t.Context(), key, load)
			require.NoError(t, err)
			time.Sleep(100 * time.Millisecond)
			var info ResultInfo
			v, err := c.GetOrLoad(WithResultInfo(t.Context(), &info), key, load)
			require.NoError(t, err)
			assert.Equal(t, tc.wantPrice, v.Price)
			assert.Equal(t, tc.wantStale, info.Stale)
			require.NoError(t, c.Close())
		})
	}
}

func TestWithoutStaleAnExpiredValueIsAMiss(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var ev eventCounts
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0), WithObserver(ev.observe))
	src := &counter{}
	_, err := c.GetOrLoad(t.Context(), p+"k", src.load)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	v, err := c.GetOrLoad(t.Context(), p+"k", src.load)
	require.NoError(t, err)
	assert.Equal(t, 2, v.Price)
	assert.Zero(t, ev[EventStaleServed].Load())
	assert.Equal(t, int64(2), ev[EventMiss].Load())
}

func TestWithoutStaleAValueInTheRefreshGraceIsNotStale(t *testing.T) {
	t.Parallel()
	// Early refresh keeps a value readable for a grace past its TTL, so that
	// a late refresh is not a miss. Without WithStale that value is served as
	// a hit being refreshed: never marked stale, never EventStaleServed.
	rdb, p := setup(t)
	key := p + "k"
	var ev eventCounts
	c := New[product](rdb, WithObserver(ev.observe)) // early refresh on by default, no WithStale
	data, err := json.Marshal(product{ID: "graced"})
	require.NoError(t, err)
	// Expired 10 ms ago, loaded in 1 s: a grace of 3 s.
	rec := record.EncodeFresh(0, record.Freshness{Expiry: time.Now().Add(-10 * time.Millisecond), Load: time.Second}, data)
	require.NoError(t, rdb.Set(t.Context(), key, rec, time.Minute).Err())

	var getInfo, loadInfo ResultInfo
	v, err := c.Get(WithResultInfo(t.Context(), &getInfo), key)
	require.NoError(t, err)
	assert.Equal(t, "graced", v.ID)
	src := &counter{}
	v, err = c.GetOrLoad(WithResultInfo(t.Context(), &loadInfo), key, src.load)
	require.NoError(t, err)
	assert.Equal(t, "graced", v.ID, "served while its refresh runs")
	require.NoError(t, c.Close()) // waits for the refresh
	assert.False(t, getInfo.Stale, "Get marked a value in the refresh grace stale without WithStale")
	assert.False(t, loadInfo.Stale, "GetOrLoad marked a value in the refresh grace stale without WithStale")
	assert.Zero(t, ev[EventStaleServed].Load(), "EventStaleServed without WithStale")
	assert.Equal(t, int64(1), ev[EventRefresh].Load(), "the late refresh ran")
	assert.Equal(t, int64(1), src.calls.Load())
}
