package cache

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
)

// Tests of WithNearPerKey: strict near caches whose writes wait for the
// holders of their keys only. The whole is attacked across OS processes
// (frozen, killed, restarted) in the reliability module.

// agedHoldRegistry makes the per-key registry of p older than any lease, so
// that writes do not wait out one lease for a registry just created.
func agedHoldRegistry(t *testing.T, admin *redis.Client, p string) {
	t.Helper()
	require.NoError(t, admin.HSet(t.Context(), coherence.HoldRegistryKey(p), "~since", serverMillis(t, admin)-time.Minute.Milliseconds()).Err())
}

// A holder whose subscribed connection hears nothing (held at a proxy, as
// a partitioned or frozen process) holds a key: every kind of write of that
// key waits until the holder no longer serves it, so a read right after the
// write returned gets the new value; the writer waits out the holder's
// lease (it never acknowledged). Writes of a key it does not hold wait for
// nobody.
func TestPerKeyHolderIsWaitedForByEveryWriteOfItsKey(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	agedHoldRegistry(t, admin, p)
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	const lease = 600 * time.Millisecond
	r, _ := newNearCacheOn(t, redistest.Client(t, proxy.Addr), p, WithNearPerKey(), WithNearLease(lease), WithTags())
	w, wev := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithNearPerKey(), WithNearLease(lease), WithTags())
	for i, write := range []struct {
		name string
		do   func(key string) error
	}{
		{"Set", func(key string) error { return w.Set(t.Context(), key, product{ID: "new"}) }},
		{"Delete", func(key string) error { return w.Delete(t.Context(), key) }},
		{"Expire", func(key string) error { return w.Expire(t.Context(), key) }},
		{"DeleteByTag", func(key string) error { return w.DeleteByTag(t.Context(), "t") }},
		{"Clear", func(key string) error { return w.Clear(t.Context()) }},
	} {
		key := "k" + strconv.Itoa(i)
		require.NoError(t, w.Set(t.Context(), key, product{ID: "old"}, Tags("t")))
		warmNear(t, r, key, "old")
		require.True(t, eventually(func() bool { return nearReady(r) }))
		ids := r.near.track.ConnIDs()
		require.Len(t, ids, 1)
		release := proxy.Hold(t, admin, ids[0])
		lapses := wev.get(EventNearLeaseWait)
		require.NoError(t, w.Set(t.Context(), "other"+strconv.Itoa(i), product{ID: "x"}))
		assert.Equal(t, lapses, wev.get(EventNearLeaseWait), "%s: a write of a key the holder does not hold waited for it", write.name)
		require.NoError(t, write.do(key))
		v, err := r.GetOrLoad(t.Context(), key, func(context.Context) (product, error) { return product{ID: "loaded"}, nil })
		release()
		require.NoError(t, err)
		assert.NotEqual(t, "old", v.ID, "%s: a read after the write returned got the old value from memory", write.name)
		assert.Greater(t, wev.get(EventNearLeaseWait), lapses, "%s: the write did not wait for the silent holder", write.name)
		require.True(t, eventually(func() bool { return nearReady(r) }), "the holder never served again")
	}
}

// The registration: a read that memory keeps registers its process as a
// holder of the key, next to it, expiring a minute after; those names are
// reserved; and the process leases in the per-key registry, which Close
// leaves.
func TestPerKeyHolderRegistersAndResigns(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	agedHoldRegistry(t, admin, p)
	r, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithNearPerKey(), WithNearMaxAge(time.Hour))
	require.NoError(t, r.Set(t.Context(), "k", product{ID: "v"}, TTL(time.Hour)))
	warmNear(t, r, "k", "v")
	e, _ := r.near.store.GetIfPresent("k")
	assert.LessOrEqual(t, time.Duration(e.until-clock.Now()), coherence.HoldKeep, "memory keeps the value past its registration")
	id := r.near.track.ID()
	holders := coherence.HoldersKey(p + "k")
	assert.Equal(t, []string{id}, admin.HKeys(t.Context(), holders).Val())
	assert.Greater(t, admin.PTTL(t.Context(), holders).Val(), 50*time.Second)
	assert.True(t, admin.HExists(t.Context(), coherence.HoldRegistryKey(p), id).Val(), "no lease in the per-key registry")
	assert.Zero(t, admin.Exists(t.Context(), coherence.RegistryKey(p)).Val(), "the registry that makes every write wait for everyone exists")
	assert.ErrorIs(t, r.Set(t.Context(), strings.TrimPrefix(holders, p), product{}), ErrReservedKey, "a value could be stored where holders are")
	require.NoError(t, r.Close())
	assert.False(t, admin.HExists(t.Context(), coherence.HoldRegistryKey(p), id).Val(), "a closed cache still holds its lease")
}

// A per-key registry lost (flushed, evicted) may have held leases that
// still run: the next write waits out one lease, as for the registry of
// holders that track by prefix.
func TestPerKeyLostRegistryMakesWritesWaitOneLease(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	agedHoldRegistry(t, admin, p)
	const lease = 400 * time.Millisecond
	w, _ := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p, WithNearPerKey(), WithNearLease(lease))
	began := time.Now()
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "a"}))
	first := time.Since(began)
	require.Less(t, first, lease/2)
	require.NoError(t, admin.Del(t.Context(), coherence.HoldRegistryKey(p)).Err())
	began = time.Now()
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "b"}))
	assert.GreaterOrEqual(t, time.Since(began), lease/2, "Set after the per-key registry was lost (the first took %v)", first)
}

// A per-key near cache on a Redis that may evict its holders' records says
// so once, as a warning; on one that does not, nothing.
func TestPerKeyNearCacheWarnsOfEviction(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it sets maxmemory")
	admin := redistest.Client(t, srv.Addr)
	for _, policy := range []string{"noeviction", "allkeys-lru"} {
		require.NoError(t, admin.ConfigSet(t.Context(), "maxmemory", "100mb").Err())
		require.NoError(t, admin.ConfigSet(t.Context(), "maxmemory-policy", policy).Err())
		logs := &logCapture{}
		c := New[product](redistest.Client(t, srv.Addr), WithPrefix(policy+":"), WithNearPerKey(), WithLogger(slog.New(logs)))
		warned := func() bool {
			for _, l := range logs.lines(slog.LevelWarn) {
				if strings.Contains(l, "maxmemory-policy "+policy) {
					return true
				}
			}
			return false
		}
		if policy == "noeviction" {
			require.True(t, eventually(func() bool { return nearReady(c) }))
			assert.False(t, warned(), "a warning under noeviction")
		} else {
			assert.True(t, eventually(warned), "no warning under %s", policy)
		}
		require.NoError(t, c.Close())
	}
}

// A registration lost with Redis's data (here FLUSHALL; a restart without
// persistence, a failover that lost the write) is sent again by the next
// read, although this process registered the key less than 20s before:
// every drop of everything forgets the registrations. The holder's
// subscribed connection is then held at a proxy, and a write still waits
// for it.
func TestPerKeyRegistrationsSentAgainAfterAFlush(t *testing.T) {
	srv := redistest.PrivateServer(t, "it flushes")
	admin := redistest.Client(t, srv.Addr)
	p := "flush:"
	proxy := redistest.NewProxy(t, srv.Addr)
	const lease = 600 * time.Millisecond
	r, _ := newNearCacheOn(t, redistest.Client(t, proxy.Addr), p, WithNearPerKey(), WithNearLease(lease))
	w, wev := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, WithNearPerKey(), WithNearLease(lease))
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "a"}))
	warmNear(t, r, "k", "a")
	require.NoError(t, admin.FlushAll(t.Context()).Err())
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "old"}))
	warmNear(t, r, "k", "old")
	assert.EqualValues(t, 1, admin.Exists(t.Context(), coherence.HoldersKey(p+"k")).Val(), "the read after the flush did not register again")
	time.Sleep(2 * lease) // past the grace of the registry the flush took
	require.True(t, eventually(func() bool { return nearReady(r) }))
	release := proxy.Hold(t, admin, r.near.track.ConnIDs()[0])
	lapses := wev.get(EventNearLeaseWait)
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "new"}))
	v, err := r.Get(t.Context(), "k")
	release()
	require.NoError(t, err)
	assert.NotEqual(t, "old", v.ID, "a read after Set returned got the old value from memory")
	assert.Greater(t, wev.get(EventNearLeaseWait), lapses, "the write did not wait for the holder")
}

// Under maxmemory a strict near cache's write is still confirmed: the
// marker key cannot be written, so the marker is published once the write
// returned.
func TestWriteUnderMaxmemoryIsConfirmed(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it sets maxmemory", "--maxmemory-policy", "noeviction")
	admin := redistest.Client(t, srv.Addr)
	for _, perKey := range []bool{false, true} {
		p := "oom" + strconv.FormatBool(perKey) + ":"
		opts := []Option{}
		if perKey {
			opts = append(opts, WithNearPerKey())
		}
		r, _ := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, opts...)
		w, _ := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, opts...)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: "a"}))
		warmNear(t, r, "k", "a")
		time.Sleep(1500 * time.Millisecond) // past the registries' grace
		require.NoError(t, admin.ConfigSet(t.Context(), "maxmemory", "1").Err())
		err := w.Delete(t.Context(), "k")
		require.NoError(t, admin.ConfigSet(t.Context(), "maxmemory", "0").Err())
		assert.NoError(t, err, "Delete under maxmemory (per key: %v)", perKey)
		_, err = r.Get(t.Context(), "k")
		assert.ErrorIs(t, err, ErrCacheMiss, "a read after Delete returned got the value (per key: %v)", perKey)
	}
}

// Under the command rule of the previous version (no HGET, HKEYS), writes
// still succeed: the per-key confirmation, refused, gives way to the one
// of earlier versions.
func TestWritesUnderThePreviousCommandRule(t *testing.T) {
	t.Parallel()
	rule := []any{"~*", "&*"}
	for _, c := range strings.Fields("-@all +hello +auth +get +mget +set +del +evalsha +eval +publish +subscribe +unsubscribe +ping +pexpire +pttl +time +hset +hsetnx +hdel +hexists +hgetall +exists +info +client|id +client|tracking +script|load") {
		rule = append(rule, c)
	}
	user, _ := aclUser(t, rule)
	strict := New[product](user(), WithPrefix("product:"), WithNearCache(1<<20))
	defer strict.Close()
	w := New[product](user(), WithPrefix("product:"))
	defer w.Close()
	for i := range 3 {
		want := strconv.Itoa(i)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: want}), "Set %d under the previous version's rule", i)
		v, err := strict.Get(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, want, v.ID)
	}
}
