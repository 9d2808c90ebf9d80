package cache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/require"
)

// storedVersion reads the version of the record at key, straight from Redis.
func storedVersion(t *testing.T, rdb *redis.Client, key string) (int64, bool) {
	t.Helper()
	b, err := rdb.Get(t.Context(), key).Bytes()
	require.NoError(t, err)
	_, _, err = record.Decode(b)
	require.NoError(t, err)
	return record.ReadVersion(b)
}

// TestVersionedSetRefusesOlder is the forced interleaving of two writers
// (two Caches on two clients, as two processes): the newer write's Set
// returns first, the older one's Set comes after it and is refused; every
// reader, near caches included, keeps the newer value.
func TestVersionedSetRefusesOlder(t *testing.T) {
	t.Parallel()
	for _, near := range []bool{false, true} {
		t.Run(fmt.Sprintf("near=%v", near), func(t *testing.T) {
			t.Parallel()
			rdb, p := setup(t)
			opts := []Option{WithPrefix(p)}
			if !near {
				opts = append(opts, WithoutNearCache())
			}
			a := New[product](rdb, opts...)
			b := New[product](redistest.Client(t, redistest.Addr(t)), opts...)
			t.Cleanup(func() { a.Close(); b.Close() })
			ctx := t.Context()
			const rounds = 50
			for i := range rounds {
				key := fmt.Sprintf("k%d", i)
				// Both processes read the key first, so that near caches hold it.
				require.NoError(t, a.Set(ctx, key, product{ID: "v0"}, Version(0)))
				for _, c := range []*Cache[product]{a, b} {
					v, err := c.Get(ctx, key)
					require.NoError(t, err)
					require.Equal(t, "v0", v.ID)
				}
				// The source: a wrote version 1, then b wrote version 2; b's
				// Set returns first.
				require.NoError(t, b.Set(ctx, key, product{ID: "v2"}, Version(2)))
				err := a.Set(ctx, key, product{ID: "v1"}, Version(1))
				if !errors.Is(err, ErrOlderVersion) {
					t.Fatalf("round %d: Set at version 1 after version 2 = %v; want ErrOlderVersion", i, err)
				}
				for name, c := range map[string]*Cache[product]{"the refused writer": a, "the newer writer": b} {
					v, err := c.Get(ctx, key)
					require.NoError(t, err)
					if v.ID != "v2" {
						t.Fatalf("round %d: %s reads %q after the older Set was refused; want v2", i, name, v.ID)
					}
				}
				if v, ok := storedVersion(t, rdb, p+key); !ok || v != 2 {
					t.Fatalf("round %d: stored version %d, %v; want 2", i, v, ok)
				}
			}
		})
	}
}

// TestVersionedSetRules: what a versioned Set is compared with.
func TestVersionedSetRules(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithPrefix(p), WithStale(time.Minute))
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	get := func(key string) string {
		t.Helper()
		v, err := c.Get(ctx, key, SkipNear())
		require.NoError(t, err)
		return v.ID
	}

	// An equal version is written again (a retried Set).
	require.NoError(t, c.Set(ctx, "eq", product{ID: "a"}, Version(5)))
	require.NoError(t, c.Set(ctx, "eq", product{ID: "b"}, Version(5)))
	require.Equal(t, "b", get("eq"))

	// Negative versions order as numbers.
	require.NoError(t, c.Set(ctx, "neg", product{ID: "a"}, Version(-1)))
	require.ErrorIs(t, c.Set(ctx, "neg", product{ID: "b"}, Version(-2)), ErrOlderVersion)
	require.NoError(t, c.Set(ctx, "neg", product{ID: "c"}, Version(0)))
	require.Equal(t, "c", get("neg"))

	// A value without a version (a plain Set, a load) takes any version; a
	// plain Set always writes, and drops the version.
	require.NoError(t, c.Set(ctx, "plain", product{ID: "a"}))
	require.NoError(t, c.Set(ctx, "plain", product{ID: "b"}, Version(-100)))
	require.NoError(t, c.Set(ctx, "plain", product{ID: "c"}))
	require.NoError(t, c.Set(ctx, "plain", product{ID: "d"}, Version(-200)))
	require.Equal(t, "d", get("plain"))
	_, err := c.GetOrLoad(ctx, "loaded", func(context.Context) (product, error) { return product{ID: "a"}, nil })
	require.NoError(t, err)
	require.NoError(t, c.Set(ctx, "loaded", product{ID: "b"}, Version(1)))
	require.Equal(t, "b", get("loaded"))

	// After Delete, any version is written.
	require.NoError(t, c.Set(ctx, "del", product{ID: "a"}, Version(10)))
	require.NoError(t, c.Delete(ctx, "del"))
	require.NoError(t, c.Set(ctx, "del", product{ID: "b"}, Version(1)))
	require.Equal(t, "b", get("del"))

	// Expire keeps the version: an older Set is still refused.
	require.NoError(t, c.Set(ctx, "exp", product{ID: "a"}, Version(10)))
	require.NoError(t, c.Expire(ctx, "exp"))
	if v, ok := storedVersion(t, rdb, p+"exp"); !ok || v != 10 {
		t.Fatalf("version after Expire = %d, %v; want 10", v, ok)
	}
	require.ErrorIs(t, c.Set(ctx, "exp", product{ID: "b"}, Version(9)), ErrOlderVersion)
	require.NoError(t, c.Set(ctx, "exp", product{ID: "c"}, Version(11)))
	require.Equal(t, "c", get("exp"))

	// A record the script cannot read (another program's bytes) is replaced.
	require.NoError(t, rdb.Set(ctx, p+"foreign", "not a record", 0).Err())
	require.NoError(t, c.Set(ctx, "foreign", product{ID: "a"}, Version(1)))
	require.Equal(t, "a", get("foreign"))
}

// TestVersionedSetConcurrentWriters: writers racing on one key with
// versions in random order leave the highest version, whatever the order
// their Sets land in; each Set is either written or refused.
func TestVersionedSetConcurrentWriters(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var caches []*Cache[product]
	for range 4 {
		c := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p))
		t.Cleanup(func() { c.Close() })
		caches = append(caches, c)
	}
	ctx := t.Context()
	const writes = 200
	versions := rand.Perm(writes)
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := 0
	for i, v := range versions {
		wg.Go(func() {
			err := caches[i%len(caches)].Set(ctx, "k", product{ID: fmt.Sprint(v)}, Version(int64(v)))
			switch {
			case errors.Is(err, ErrOlderVersion):
				mu.Lock()
				refused++
				mu.Unlock()
			case err != nil:
				t.Errorf("Set at version %d: %v", v, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d concurrent versioned Sets, %d refused", writes, refused)
	for _, c := range caches {
		got, err := c.Get(ctx, "k")
		require.NoError(t, err)
		if got.ID != fmt.Sprint(writes-1) {
			t.Fatalf("after %d concurrent versioned Sets, Get = %q; want the highest version, %d", writes, got.ID, writes-1)
		}
	}
	if v, ok := storedVersion(t, rdb, p+"k"); !ok || v != writes-1 {
		t.Fatalf("stored version %d, %v; want %d", v, ok, writes-1)
	}
}

// TestLoaderSetVersion: a loader of one key stores the row's version with
// the value, so that a late versioned Set older than the load is refused;
// a loader of several keys cannot.
func TestLoaderSetVersion(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithPrefix(p))
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	var ok bool
	_, err := c.GetOrLoad(ctx, "k", func(ctx context.Context) (product, error) {
		ok = SetVersion(ctx, 5)
		return product{ID: "loaded at 5"}, nil
	})
	require.NoError(t, err)
	require.True(t, ok, "SetVersion in a loader of one key")
	if v, ok := storedVersion(t, rdb, p+"k"); !ok || v != 5 {
		t.Fatalf("stored version after the load = %d, %v; want 5", v, ok)
	}
	require.ErrorIs(t, c.Set(ctx, "k", product{ID: "set at 4"}, Version(4)), ErrOlderVersion)
	require.NoError(t, c.Set(ctx, "k", product{ID: "set at 6"}, Version(6)))
	got, err := c.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "set at 6", got.ID)

	require.False(t, SetVersion(ctx, 1), "SetVersion outside a loader")
	_, err = c.GetOrLoadMany(ctx, []string{"a", "b"}, func(ctx context.Context, keys []string) (map[string]product, error) {
		ok = SetVersion(ctx, 7)
		return map[string]product{"a": {ID: "a"}, "b": {ID: "b"}}, nil
	})
	require.NoError(t, err)
	require.False(t, ok, "SetVersion in a loader of two keys")
	for _, k := range []string{"a", "b"} {
		if _, ok := storedVersion(t, rdb, p+k); ok {
			t.Fatalf("%s stored with a version by a loader of two keys", k)
		}
	}
}
