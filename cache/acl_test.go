// This file runs the whole read path as a Redis ACL user restricted to the
// cache's prefix, as a service sharing a Redis with others is configured: the
// locks were once "{T}:stampede:lock:key" and the channels
// "{T}:stampede:notify", outside "~product:* &product:*", and every call
// failed with NOPERM.

package cache

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/notify"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// aclRule is what the README tells a service with the prefix "product:" to
// grant: its keys, the near caches' lease registries, its channels, and
// the near cache's invalidation channel.
var aclRule = []any{"~product:*", "~{*}:stampede:near:product:", "~{*}:stampede:hold:product:", "&product:*", "&__redis__:invalidate", "+@all"}

// aclCommands is GUARANTEES.md's rule of the commands the library sends.
var aclCommands = strings.Fields("-@all +hello +auth +get +mget +set +del +evalsha +eval +publish +spublish +subscribe +ssubscribe +unsubscribe +sunsubscribe +ping +pexpire +pttl +time +hset +hsetnx +hdel +hexists +hget +hgetall +hkeys +exists +info +client|id +client|tracking +client|list +script|load")

// aclUser creates the ACL user product-svc with rule on a private server
// and returns a function making clients of it, and an admin client.
func aclUser(t *testing.T, rule []any) (user func() *redis.Client, admin *redis.Client) {
	srv := redistest.PrivateServer(t, "it creates an ACL user")
	admin = redistest.Client(t, srv.Addr)
	args := append([]any{"ACL", "SETUSER", "product-svc", "on", ">secret", "resetkeys", "resetchannels"}, rule...)
	require.NoError(t, admin.Do(t.Context(), args...).Err())
	return func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "product-svc", Password: "secret", ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}, admin
}

func TestReadPathUnderPrefixACL(t *testing.T) {
	t.Parallel()
	user, admin := aclUser(t, aclRule)
	// The rule is enforced: a key outside the prefix is refused.
	require.ErrorContains(t, user().Set(t.Context(), "other:1", "x", 0).Err(), "NOPERM")

	var mu sync.Mutex
	var hookErrs []error
	var woken, redisErrs atomic.Int64
	opts := []Option{
		WithPrefix("product:"), WithRetry(50, time.Second),
		WithErrorHook(func(key string, err error) {
			mu.Lock()
			defer mu.Unlock()
			hookErrs = append(hookErrs, err)
		}),
		eventCount(EventWoken, &woken), eventCount(EventRedisError, &redisErrs),
	}
	holder := New[product](user(), opts...)
	defer holder.Close()
	c := New[product](user(), opts...) // another client: another process's cache
	defer c.Close()

	// A miss: the holder loads, the waiter is woken by its notification.
	gate := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := holder.GetOrLoad(context.Background(), "42", func(context.Context) (product, error) {
			<-gate
			return product{ID: "holder"}, nil
		})
		held <- err
	}()
	waitFor(t, func() bool { return admin.Exists(t.Context(), LockKey("product:42")).Val() == 1 })
	got := make(chan product, 1)
	src := &counter{}
	go func() {
		v, err := c.GetOrLoad(context.Background(), "42", src.load)
		assert.NoError(t, err)
		got <- v
	}()
	ch := notify.Channel("product:", "product:42")
	waitFor(t, func() bool { // SSUBSCRIBE, or SUBSCRIBE on Redis < 7
		return admin.PubSubShardNumSub(t.Context(), ch).Val()[ch]+admin.PubSubNumSub(t.Context(), ch).Val()[ch] == 1
	})
	close(gate)
	require.NoError(t, <-held)
	assert.Equal(t, "holder", (<-got).ID)
	assert.EqualValues(t, 1, woken.Load(), "EventWoken")
	assert.Zero(t, src.calls.Load(), "the waiter's loads")

	// A hit, Set, Get, Delete, GetOrLoadMany.
	v, err := c.GetOrLoad(t.Context(), "42", src.load)
	require.NoError(t, err)
	assert.Equal(t, "holder", v.ID)
	require.NoError(t, c.Set(t.Context(), "42", product{ID: "set"}))
	v, err = c.Get(t.Context(), "42")
	require.NoError(t, err)
	assert.Equal(t, "set", v.ID)
	require.NoError(t, c.Delete(t.Context(), "42"))
	many, err := c.GetOrLoadMany(t.Context(), []string{"1", "2", "42"}, func(_ context.Context, keys []string) (map[string]product, error) {
		m := map[string]product{}
		for _, k := range keys {
			m[k] = product{ID: "many:" + k}
		}
		return m, nil
	})
	require.NoError(t, err)
	assert.Len(t, many, 3)
	assert.Zero(t, src.calls.Load(), "loads of the single-key loader")

	// The near cache: its tracking connection listens on
	// __redis__:invalidate, the one channel outside the prefix.
	near := New[product](user(), append(opts, WithNearCache(1<<20))...)
	defer near.Close()
	for range 2 {
		v, err = near.GetOrLoad(t.Context(), "near", src.load)
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, src.calls.Load(), "loads of the near cache's key")
	require.NoError(t, c.Set(t.Context(), "near", product{ID: "new"}))
	waitFor(t, func() bool {
		v, err := near.GetOrLoad(t.Context(), "near", src.load)
		return err == nil && v.ID == "new"
	})

	// A per-key near cache: its reads register it next to the key, its
	// lease is in the per-key registry, a write waits for it.
	perKey := New[product](user(), append(opts, WithNearCache(1<<20), WithNearPerKey())...)
	defer perKey.Close()
	waitFor(t, func() bool {
		v, err := perKey.Get(t.Context(), "near")
		return err == nil && v.ID == "new" && nearHas(perKey, "near")
	})
	require.NoError(t, c.Set(t.Context(), "near", product{ID: "newer"}))
	v, err = perKey.Get(t.Context(), "near")
	require.NoError(t, err)
	assert.Equal(t, "newer", v.ID, "a read after the write returned got the old value")
	assert.EqualValues(t, 1, admin.Exists(t.Context(), coherence.HoldRegistryKey("product:")).Val(), "no per-key registry")

	assert.EqualValues(t, 1, admin.Exists(t.Context(), coherence.RegistryKey("product:")).Val(), "the leases are not in their registry")
	assert.Zero(t, admin.Exists(t.Context(), coherence.LegacyRegistryKey("product:")).Val(), "the registry of earlier versions made")

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, hookErrs, "errors reported to the hook")
	assert.Zero(t, redisErrs.Load(), "EventRedisError")
}

// The narrow rule of GUARANTEES.md (the commands the library sends, and no
// other) runs every call: reads, loads, writes, tags and Clear, a strict
// near cache and a per-key one serving from memory and waited for.
func TestCommandRuleRunsEveryCall(t *testing.T) {
	t.Parallel()
	v, err := redistest.ServerVersion()
	require.NoError(t, err)
	cmds := aclCommands
	if !v.ShardedPubSub() { // (Redis 6.2 has none: the rule leaves them out)
		cmds = slices.DeleteFunc(slices.Clone(cmds), func(c string) bool {
			return c == "+spublish" || c == "+ssubscribe" || c == "+sunsubscribe"
		})
	}
	rule := slices.Clone(aclRule[:len(aclRule)-1]) // (not +@all)
	for _, c := range cmds {
		rule = append(rule, c)
	}
	user, _ := aclUser(t, rule)
	var failures atomic.Int64
	opts := []Option{WithPrefix("product:"), WithTags(), WithErrorHook(func(string, error) { failures.Add(1) }), eventCount(EventRedisError, &failures)}
	var strictHits, perKeyHits atomic.Int64
	strict := New[product](user(), append(opts, WithNearCache(1<<20), eventCount(EventNearHit, &strictHits))...)
	defer strict.Close()
	perKey := New[product](user(), append(opts, WithNearCache(1<<20), WithNearPerKey(), eventCount(EventNearHit, &perKeyHits))...)
	defer perKey.Close()
	w := New[product](user(), opts...)
	defer w.Close()
	for i := range 3 {
		want := fmt.Sprint(i)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: want}, Tags("t")))
		for _, c := range []*Cache[product]{strict, perKey} {
			v, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
			require.NoError(t, err)
			require.Equal(t, want, v.ID, "a read after the Set returned got an old value")
			waitFor(t, func() bool { v, err := c.Get(t.Context(), "k"); return err == nil && v.ID == want && nearHas(c, "k") })
		}
	}
	require.NoError(t, w.DeleteByTag(t.Context(), "t"))
	require.NoError(t, w.Clear(t.Context()))
	_, err = perKey.Get(t.Context(), "k")
	require.ErrorIs(t, err, ErrCacheMiss)
	assert.Positive(t, strictHits.Load(), "the strict near cache never served")
	assert.Positive(t, perKeyHits.Load(), "the per-key near cache never served")
	assert.Zero(t, failures.Load(), "calls failed under the rule")
}

// Under the rule of versions before 0.4, which grants the prefix but not
// the lease registry, the near cache serves and keeps read-after-write with
// the registry under the prefix, and says once how to grant the other.
func TestNearCacheUnderTheRuleOfEarlierVersions(t *testing.T) {
	t.Parallel()
	user, admin := aclUser(t, []any{"~product:*", "&product:*", "&__redis__:invalidate", "+@all"})
	logs := &logCapture{}
	ev := &events{}
	r := New[product](user(), WithPrefix("product:"), WithLogger(slog.New(logs)), ev.option())
	defer r.Close()
	w := New[product](user(), WithPrefix("product:"))
	defer w.Close()
	for i := range 20 {
		want := fmt.Sprint(i)
		require.NoError(t, w.Set(t.Context(), "k", product{ID: want}))
		v, err := r.GetOrLoad(t.Context(), "k", (&counter{}).load)
		require.NoError(t, err)
		require.Equal(t, want, v.ID, "read %d after the Set returned got an old value", i)
		require.True(t, eventually(func() bool { return nearReady(r) && nearHas(r, "k") }), "never in memory")
		v, err = r.GetOrLoad(t.Context(), "k", (&counter{}).load) // from memory
		require.NoError(t, err)
		require.Equal(t, want, v.ID)
	}
	assert.Positive(t, ev.get(EventNearHit), "the near cache never served")
	assert.True(t, admin.HExists(t.Context(), coherence.LegacyRegistryKey("product:"), r.near.track.ID()).Val(), "no lease where the rule allows it")
	assert.Zero(t, admin.Exists(t.Context(), coherence.RegistryKey("product:")).Val())
	lines := logs.lines(slog.LevelWarn)
	require.Len(t, lines, 1, "one word for the refused registry: %q", lines)
	assert.Contains(t, lines[0], "~{*}:stampede:near:product:")
	assert.Empty(t, logs.lines(slog.LevelError))
}
