// This file proves the quarantine of keys whose records cannot be decoded:
// its intervals on a given clock, its bound, what ends it, and against a
// real Redis that a key another program keeps rewriting costs one load, not
// one per read.

package cache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadedAt is what a load of key under a lock taken at locked gives q.
func loadedAt(q *quarantine[product], key, data string, locked time.Time) {
	q.loaded(key, &result[product]{data: []byte(data)}, locked)
}

// servedData is the value q answers a read of key sent at at with ("":
// none, the read loads).
func servedData(q *quarantine[product], key string, at time.Time) string {
	r := q.held(key, at)
	if r == nil {
		return ""
	}
	if !r.quarantined {
		panic("a quarantine answer not marked as one")
	}
	return string(r.data)
}

// TestQuarantineIntervals: after a decode error a key's load is kept and
// served for 100 ms after its lock, then 200 ms after the next load's, and
// so on, doubling up to 5 s, or the TTL if shorter.
func TestQuarantineIntervals(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	q := newQuarantine[product](time.Hour)
	require.Empty(t, servedData(q, "k", at(0)), "a first decode error loads")
	loadedAt(q, "k", "v1", at(1))
	want := []struct {
		interval int // ms
		value    string
	}{{100, "v1"}, {200, "v2"}, {400, "v3"}, {800, "v4"}, {1600, "v5"}, {3200, "v6"}, {5000, "v7"}, {5000, "v8"}}
	locked := 1
	for i, w := range want {
		assert.Equal(t, w.value, servedData(q, "k", at(locked+w.interval-1)), "load %d: served within its interval", i+1)
		end := locked + w.interval
		assert.Empty(t, servedData(q, "k", at(end)), "load %d: loaded again once its interval of %d ms is over", i+1, w.interval)
		locked = end + 1
		loadedAt(q, "k", fmt.Sprintf("v%d", i+2), at(locked))
	}

	short := newQuarantine[product](time.Second)
	assert.Equal(t, time.Second, short.limit, "no value is served longer than the TTL")
	tiny := newQuarantine[product](10 * time.Millisecond)
	assert.Equal(t, 10*time.Millisecond, tiny.first)
}

// TestQuarantineKeepsOnlyLoadsAfterTheDecodeError: a load whose lock was
// taken before the read that found the quarantine due (one that began
// before a write ended an earlier quarantine) is not kept, nor is a load of
// a key that is not quarantined.
func TestQuarantineKeepsOnlyLoadsAfterTheDecodeError(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	q := newQuarantine[product](time.Hour)
	loadedAt(q, "k", "unrelated", t0)
	assert.Zero(t, q.n.Load(), "a load of a key not quarantined")

	require.Empty(t, servedData(q, "k", t0))
	loadedAt(q, "k", "older", t0.Add(-time.Millisecond))
	assert.Empty(t, servedData(q, "k", t0.Add(time.Millisecond)), "a load that began before the decode error was kept")
	loadedAt(q, "k", "newer", t0.Add(2*time.Millisecond))
	assert.Equal(t, "newer", servedData(q, "k", t0.Add(3*time.Millisecond)))
	loadedAt(q, "k", "late", t0.Add(4*time.Millisecond))
	assert.Equal(t, "newer", servedData(q, "k", t0.Add(5*time.Millisecond)), "a load the quarantine was not due for replaced its value")
}

// TestQuarantineEnds: a record that decodes, other than the one loaded
// last, ends the quarantine, as do this process's writes; a write of
// another key does not.
func TestQuarantineEnds(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	start := func(q *quarantine[product], key string) {
		q.held(key, t0)
		loadedAt(q, key, "kept", t0)
		require.Equal(t, "kept", servedData(q, key, t0), "%s not quarantined", key)
	}
	tests := []struct {
		name  string
		end   func(q *quarantine[product])
		ended bool
	}{
		{"its own commit read back", func(q *quarantine[product]) { q.decoded("k", []byte("kept")) }, false},
		{"another value decoded", func(q *quarantine[product]) { q.decoded("k", []byte("other")) }, true},
		{"another key decoded", func(q *quarantine[product]) { q.decoded("j", []byte("other")) }, false},
		{"a write of the key", func(q *quarantine[product]) { q.forget("j", "k") }, true},
		{"a write of another key", func(q *quarantine[product]) { q.forget("j") }, false},
		{"DeleteByTag or Clear", func(q *quarantine[product]) { q.clear() }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newQuarantine[product](time.Hour)
			start(q, "k")
			tt.end(q)
			if got := servedData(q, "k", t0); (got == "") != tt.ended {
				t.Errorf("served %q after %s; want ended = %v", got, tt.name, tt.ended)
			}
		})
	}
}

// TestQuarantineIsBounded: past quarantineKeys keys the one loaded longest
// ago is forgotten first.
func TestQuarantineIsBounded(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	q := newQuarantine[product](time.Hour)
	for i := range quarantineKeys {
		k := fmt.Sprint(i)
		q.held(k, t0)
		loadedAt(q, k, k, t0)
	}
	q.held("0", t0.Add(time.Hour)) // key 0 is due again...
	loadedAt(q, "0", "0", t0.Add(time.Hour))
	q.held("new", t0) // ...and so the longest ago is key 1
	assert.EqualValues(t, quarantineKeys, q.n.Load())
	assert.Len(t, q.keys, quarantineKeys)
	for _, k := range []string{"0", "2", "new"} {
		assert.Contains(t, q.keys, k)
	}
	assert.NotContains(t, q.keys, "1", "the key loaded longest ago is still kept")
}

// foreignRecord is a record that a Cache[string] wrote: a product codec
// cannot decode it.
func foreignRecord(t *testing.T, p string) []byte {
	t.Helper()
	rdb, key := redistest.Client(t, redistest.Addr(t)), p+"foreign"
	words := New[string](rdb, WithoutNearCache())
	defer words.Close()
	require.NoError(t, words.Set(t.Context(), key, "not a product"))
	b, err := rdb.Get(t.Context(), key).Bytes()
	require.NoError(t, err)
	return b
}

// quarantinedCache is a Cache[product] on p without a near cache, whose
// quarantine keeps a value an hour: within a test, only what ends a
// quarantine ends it.
func quarantinedCache(t *testing.T, rdb *redis.Client, p string, opts ...Option) *Cache[product] {
	t.Helper()
	c := New[product](rdb, append([]Option{WithPrefix(p), WithoutNearCache()}, opts...)...)
	t.Cleanup(func() { c.Close() })
	c.quarantine.first, c.quarantine.limit = time.Hour, time.Hour
	return c
}

// TestQuarantineStopsReloadStorm: another program rewrites its record at
// a key before each of 1,000 GetOrLoad calls. The first call loads and
// overwrites the record (as any unreadable record is); the others get that
// value without a load, counted as quarantined, never as hits; Get, which
// never loads, misses. Once a record the Cache can decode is at the key,
// the next foreign record is loaded again at once.
func TestQuarantineStopsReloadStorm(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	foreign := foreignRecord(t, p)
	c := quarantinedCache(t, rdb, p)
	src := &counter{}
	rewrite := func() { require.NoError(t, rdb.Set(t.Context(), p+"k", foreign, 0).Err()) }

	rewrite()
	v, err := c.GetOrLoad(t.Context(), "k", src.load)
	require.NoError(t, err)
	require.Equal(t, 1, v.Price)
	got, err := c.Get(t.Context(), "k")
	require.NoError(t, err, "the load must overwrite the foreign record")
	assert.Equal(t, v, got, "reading back the value loaded last must not end the quarantine")
	for i := range 1000 {
		rewrite()
		v, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.NoError(t, err)
		require.Equal(t, 1, v.Price, "call %d", i)
	}
	assert.Equal(t, int64(1), src.calls.Load(), "loads for 1,001 reads of a foreign record")
	_, err = c.Get(t.Context(), "k")
	assert.ErrorIs(t, err, ErrCacheMiss, "Get must not be answered by the quarantine")
	st := c.Stats()
	assert.Equal(t, int64(1000), st.Quarantined)
	assert.Equal(t, int64(1), st.RedisHits, "only Get's read of the load counts as a hit")
	assert.Equal(t, int64(1002), st.DecodeErrors)

	// A value of the Cache's type, written by another process: the key
	// decodes again, and a foreign record is loaded at once.
	other := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache())
	defer other.Close()
	require.NoError(t, other.Set(t.Context(), "k", product{ID: "from another process"}))
	v, err = c.GetOrLoad(t.Context(), "k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "from another process", v.ID)
	rewrite()
	v, err = c.GetOrLoad(t.Context(), "k", src.load)
	require.NoError(t, err)
	assert.Equal(t, 2, v.Price, "a foreign record after a readable one must be loaded again")
	assert.Equal(t, int64(2), src.calls.Load())
}

// TestQuarantineEndsWithWrites: a Delete or Set of the key, or a
// DeleteByTag, in this process ends the quarantine, so that a read after
// it never gets a value loaded before it, even from a foreign record.
func TestQuarantineEndsWithWrites(t *testing.T) {
	t.Parallel()
	writes := []struct {
		name  string
		write func(ctx context.Context, c *Cache[product]) error
	}{
		{"Delete", func(ctx context.Context, c *Cache[product]) error { return c.Delete(ctx, "k") }},
		{"Set", func(ctx context.Context, c *Cache[product]) error { return c.Set(ctx, "k", product{ID: "set"}) }},
		{"DeleteByTag", func(ctx context.Context, c *Cache[product]) error { return c.DeleteByTag(ctx, "t") }},
	}
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			rdb, p := setup(t)
			foreign := foreignRecord(t, p)
			c := quarantinedCache(t, rdb, p, WithTags())
			src := &counter{}
			for range 3 {
				require.NoError(t, rdb.Set(t.Context(), p+"k", foreign, 0).Err())
				_, err := c.GetOrLoad(t.Context(), "k", src.load)
				require.NoError(t, err)
			}
			require.Equal(t, int64(1), src.calls.Load(), "not quarantined")
			require.NoError(t, w.write(t.Context(), c))
			require.NoError(t, rdb.Set(t.Context(), p+"k", foreign, 0).Err())
			v, err := c.GetOrLoad(t.Context(), "k", src.load)
			require.NoError(t, err)
			assert.Equal(t, 2, v.Price, "the value loaded before the %s was served after it", w.name)
		})
	}
}

// TestQuarantineServesBatchesAndKeepsOutOfMemory: GetOrLoadMany is
// answered by the quarantine as GetOrLoad is, and the near cache never
// keeps what it serves (a loader that calls DoNotCache leaves the foreign
// record in place, so that every read meets it).
func TestQuarantineServesBatchesAndKeepsOutOfMemory(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	foreign := foreignRecord(t, p)
	c, rdb, _ := newNearCache(t, p)
	c.quarantine.first, c.quarantine.limit = time.Hour, time.Hour
	require.NoError(t, rdb.Set(t.Context(), p+"k", foreign, 0).Err())
	var loads int
	load := func(ctx context.Context) (product, error) {
		loads++
		DoNotCache(ctx)
		return product{ID: "loaded"}, nil
	}
	for range 100 {
		v, err := c.GetOrLoad(t.Context(), "k", load)
		require.NoError(t, err)
		require.Equal(t, "loaded", v.ID)
	}
	vs, err := c.GetOrLoadMany(t.Context(), []string{"k"}, func(ctx context.Context, keys []string) (map[string]product, error) {
		loads++
		return map[string]product{keys[0]: {ID: "batch"}}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, "loaded", vs["k"].ID)
	assert.Equal(t, 1, loads)
	st := c.Stats()
	assert.Zero(t, st.NearHits, "the quarantine's value was served from the near cache")
	assert.Equal(t, int64(100), st.Quarantined)
	assert.Equal(t, foreign, []byte(rdb.Get(t.Context(), p+"k").Val()), "the foreign record must stay (DoNotCache)")
}
