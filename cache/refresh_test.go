// This file proves early refresh: a hot key is reloaded in the
// background before it expires, once per key across instances, and no
// caller meets a miss.

package cache

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventCounts counts events by kind.
type eventCounts [64]atomic.Int64 // by EventKind, with room for kinds to come

func (e *eventCounts) observe(ev Event) { e[ev.Kind].Add(1) }

func TestEarlyRefreshReloadsBeforeExpiry(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "hot"
	var ev eventCounts
	// A TTL of 3 s: hits must reach Redis inside the refresh window before
	// the expiry, which a starved -race run beside the whole suite missed
	// with 1 s.
	c := New[product](rdb, WithTTL(3*time.Second), WithoutJitter(), WithEarlyRefresh(50), WithObserver(ev.observe))
	src := &counter{delay: 20 * time.Millisecond}
	var refreshAt atomic.Pointer[time.Time] // when the first reload began
	load := func(ctx context.Context) (product, error) {
		if src.calls.Load() > 0 {
			now := time.Now()
			refreshAt.CompareAndSwap(nil, &now)
		}
		return src.load(ctx)
	}
	v, err := c.GetOrLoad(t.Context(), key, load)
	require.NoError(t, err)
	require.Equal(t, 1, v.Price)
	raw, err := rdb.Get(t.Context(), key).Bytes()
	require.NoError(t, err)
	first, ok := record.ReadFreshness(raw)
	require.True(t, ok, "the record carries its logical expiry")

	// Hit until a refresh has run; none of these calls may load or miss.
	waitFor(t, func() bool {
		v, err := c.GetOrLoad(t.Context(), key, load)
		require.NoError(t, err)
		return v.Price == 2
	})
	require.NoError(t, c.Close())
	// Early, not late: a refresh that starts in the grace after the expiry
	// (as it does with early refresh switched off) also avoids the miss.
	if at := *refreshAt.Load(); !at.Before(first.Expiry) {
		t.Fatalf("refresh began %v after the value expired; want before it", at.Sub(first.Expiry))
	}
	assert.Equal(t, int64(1), ev[EventMiss].Load(), "only the cold read may miss")
	assert.Equal(t, src.calls.Load()-1, ev[EventRefresh].Load(), "every load after the first must be a background refresh")
	assert.Greater(t, rdb.PTTL(t.Context(), key).Val(), 500*time.Millisecond, "the refresh must store the value for a new TTL")
}

func TestEarlyRefreshOffNeverRefreshes(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var ev eventCounts
	c := New[product](rdb, WithTTL(time.Minute), WithEarlyRefresh(0), WithObserver(ev.observe), WithoutNearCache()) // the near cache turns the metadata on
	src := &counter{}
	for range 50 {
		_, err := c.GetOrLoad(t.Context(), p+"k", src.load)
		require.NoError(t, err)
	}
	require.NoError(t, c.Close())
	assert.Equal(t, int64(1), src.calls.Load())
	assert.Zero(t, ev[EventRefresh].Load())
	raw, err := rdb.Get(t.Context(), p+"k").Bytes()
	require.NoError(t, err)
	assert.Equal(t, []byte{record.V1, 0, 0}, raw[:record.HeaderLen], "no freshness metadata when nothing reads it")
}

// TestEarlyRefreshKeepsAHotKeyWarmAcrossInstances: 4 instances hit one key
// across several TTLs; the key is loaded about once per TTL and no caller
// after the cold start meets a miss.
func TestEarlyRefreshKeepsAHotKeyWarmAcrossInstances(t *testing.T) {
	// Not parallel: a refresh late by 200 ms is a miss, and its 16 busy readers would slow the others.
	_, p := setup(t)
	key := p + "hot"
	addr := redistest.Addr(t)
	var ev eventCounts
	src := &counter{delay: 100 * time.Millisecond}
	const ttl = time.Second
	var caches []*Cache[product]
	for range 4 {
		caches = append(caches, New[product](redistest.Client(t, addr), WithTTL(ttl), WithoutJitter(),
			WithEarlyRefresh(2), WithObserver(ev.observe)))
	}
	_, err := caches[0].GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)

	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range caches {
		for range 4 {
			wg.Go(func() {
				for time.Since(start) < 3*ttl {
					if _, err := c.GetOrLoad(t.Context(), key, src.load); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	for _, c := range caches {
		require.NoError(t, c.Close())
	}
	// Refreshes land some load durations before expiry, so a little more
	// than one per TTL; a refresh per instance would be 4 per TTL.
	periods := int64(time.Since(start)/ttl) + 1
	assert.Equal(t, int64(1), ev[EventMiss].Load(), "no caller may meet a miss after the cold start")
	assert.LessOrEqual(t, src.calls.Load(), 1+2*periods, "about one load per TTL across all instances")
	assert.GreaterOrEqual(t, src.calls.Load(), periods, "the key must have been refreshed every TTL")
}

// dueRecord stores at key a value whose early refresh is due: it expires in
// 500 ms and took a second to load.
func dueRecord(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	payload, err := json.Marshal(product{ID: "p0", Price: 0})
	require.NoError(t, err)
	// Due (XFetch with a 1 s load: each hit refreshes with probability
	// e^-0.5 at first), and not expired before the tests' hits end on a
	// loaded -race run (100 ms was not).
	rec := record.EncodeFresh(0, record.Freshness{Expiry: time.Now().Add(500 * time.Millisecond), Load: time.Second}, payload)
	require.NoError(t, rdb.Set(t.Context(), key, rec, time.Minute).Err())
}

// TestEarlyRefreshLockedElsewhereIsNotRetriedOnEveryHit: while another
// process holds the key's lock, a process's hits try to take it once per
// retry backoff, not once per hit.
func TestEarlyRefreshLockedElsewhereIsNotRetriedOnEveryHit(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "due"
	dueRecord(t, rdb, key)
	require.NoError(t, rdb.Set(t.Context(), LockKey(key), "another-process", 10*time.Second).Err())
	client := redistest.Client(t, redistest.Addr(t))
	cmds := redistest.CountCommands(client)
	// Without a near cache, whose lease renewals are scripts too (and a due
	// value is never kept in memory anyway).
	c := New[product](client, WithTTL(time.Second), WithoutJitter(), WithRetry(10, 100*time.Millisecond), WithoutNearCache())
	src := &counter{}
	start := time.Now()
	for range 100 {
		v, err := c.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
		require.Equal(t, "p0", v.ID)
	}
	elapsed := time.Since(start)
	require.NoError(t, c.Close())
	assert.Zero(t, src.calls.Load())
	assert.LessOrEqual(t, cmds.Count("evalsha")+cmds.Count("eval"), 2+int(elapsed/(100*time.Millisecond)),
		"one attempt at the lock per backoff (100 hits in %v)", elapsed)
}

// TestEarlyRefreshFailureIsNotRetriedOnEveryHit: a refresh whose loader
// fails is not tried again by the next hits before the throttle ends, so a
// failing database is not called once per hit.
func TestEarlyRefreshFailureIsNotRetriedOnEveryHit(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "due"
	dueRecord(t, rdb, key)
	c := New[product](rdb, WithTTL(time.Second), WithoutJitter(), WithStaleThrottle(time.Minute))
	var calls atomic.Int64
	failing := func(context.Context) (product, error) {
		calls.Add(1)
		return product{}, errors.New("database down")
	}
	for range 100 {
		v, err := c.GetOrLoad(t.Context(), key, failing)
		require.NoError(t, err)
		require.Equal(t, "p0", v.ID)
	}
	require.NoError(t, c.Close())
	assert.Equal(t, int64(1), calls.Load(), "one refresh attempt, then none until the throttle ends")
}
