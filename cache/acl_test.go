// acl_test.go runs the whole read path as a Redis ACL user restricted to the
// cache's prefix, as a service sharing a Redis with others is configured: the
// locks were once "{T}:stampede:lock:key" and the channels
// "{T}:stampede:notify", outside "~product:* &product:*", and every call
// failed with NOPERM.

package cache

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/notify"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// aclRule is what the README tells a service with the prefix "product:" to
// grant: its keys, its channels, and the near cache's invalidation channel.
var aclRule = []any{"~product:*", "&product:*", "&__redis__:invalidate", "+@all"}

func TestReadPathUnderPrefixACL(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "it creates an ACL user")
	admin := redistest.Client(t, srv.Addr)
	args := append([]any{"ACL", "SETUSER", "product-svc", "on", ">secret", "resetkeys", "resetchannels"}, aclRule...)
	require.NoError(t, admin.Do(t.Context(), args...).Err())
	user := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "product-svc", Password: "secret"})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
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

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, hookErrs, "errors reported to the hook")
	assert.Zero(t, redisErrs.Load(), "EventRedisError")
}
