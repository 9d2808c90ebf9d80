// Per-key tracking (WithEventualNearCache on a single server) against what
// a reviewer found: servers that close idle connections, callers' deadlines,
// and readers left open.

package cache

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readerConnCount counts the per-key readers' connections on the server.
func readerConnCount(t *testing.T, admin *redis.Client) int {
	t.Helper()
	list, err := admin.ClientList(t.Context()).Result()
	require.NoError(t, err)
	return strings.Count(list, " name="+coherence.ReaderName+" ")
}

// TestPerKeyNearCacheAfterTheServerClosesAnIdleReader: Redis closes idle
// normal clients after `timeout` seconds (managed services set it; a
// subscribed connection is exempt, a reader's connection is not). What the
// killed connection read is no longer tracked and nobody is told; the
// process notices only when it next reads through that connection, which a
// process serving its hot keys from memory never does. So a write of a kept
// key is never heard: memory serves the old value for the whole max age.
// Broadcast tracking (the eventual mode before the change) has no such
// hole: its only tracking connection is the exempt subscriber, pinged every
// second.
func TestPerKeyNearCacheAfterTheServerClosesAnIdleReader(t *testing.T) {
	srv := redistest.PrivateServer(t, "it sets the server's idle timeout", "--timeout", "1")
	admin := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p)
	r, _ := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, WithEventualNearCache(time.Hour))
	require.True(t, r.near.perKey)
	w := New[product](redistest.Client(t, srv.Addr), WithPrefix(p), WithoutNearCache())
	t.Cleanup(func() { w.Close() })

	require.NoError(t, w.Set(t.Context(), "k", product{ID: "old"}))
	warmNear(t, r, "k", "old")
	require.Positive(t, readerConnCount(t, admin), "no reader connection")
	// Idle past the server's timeout: a reader connection that sat idle is
	// closed (the hub's own check, which uses one every second, may keep
	// that one alive; either way the write below must be heard).
	time.Sleep(2500 * time.Millisecond)
	require.True(t, eventually(r.near.track.Serving), "the tracker never served again")

	require.NoError(t, w.Set(t.Context(), "k", product{ID: "new"}))
	ok := eventually(func() bool {
		v, err := r.Get(t.Context(), "k")
		return err == nil && v.ID == "new"
	})
	assert.True(t, ok, "memory served the old value 5s after its write (max age 1h): the invalidation was lost with the killed reader connection")
}

// TestPerKeyNearCacheSurvivesACallerDeadline: cache.New asks for
// ContextTimeoutEnabled, which the reader copies, so a caller whose ctx
// deadline ends while its read is on a reader connection makes go-redis
// close that connection (a timeout is a bad connection), and every close of
// a reader connection drops the memory of every per-key cache on the
// client. One impatient caller of any key empties everyone's near cache;
// under a latency spike, every one does. (Before the change that read went
// through the user's client: the closed connection cost nothing else.)
func TestPerKeyNearCacheSurvivesACallerDeadline(t *testing.T) {
	srv := redistest.PrivateServer(t, "it pauses the server")
	admin := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p)
	r, ev := newNearCacheOn(t, redistest.Client(t, srv.Addr), p, WithEventualNearCache(time.Hour))
	require.True(t, r.near.perKey)
	require.NoError(t, admin.Set(t.Context(), p+"other", "x", 0).Err()) // (not a record: the read's outcome does not matter)
	w := New[product](redistest.Client(t, srv.Addr), WithPrefix(p), WithoutNearCache())
	t.Cleanup(func() { w.Close() })
	require.NoError(t, w.Set(t.Context(), "hot", product{ID: "v"}))
	warmNear(t, r, "hot", "v")
	drops := ev.get(EventNearDrop)

	// Control: the same pause, a caller who waits it out: memory stays.
	require.NoError(t, admin.Do(t.Context(), "client", "pause", 300, "all").Err())
	_, _ = r.Get(t.Context(), "cold")
	require.True(t, nearHas(r, "hot"), "a pause alone dropped memory: the test proves nothing")

	require.NoError(t, admin.Do(t.Context(), "client", "pause", 500, "all").Err())
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := r.Get(ctx, "cold") // not in memory: read through the reader, which the server holds
	cancel()
	require.Error(t, err)
	time.Sleep(600 * time.Millisecond) // the pause ends

	assert.True(t, nearHas(r, "hot"), "one caller's deadline on another key dropped the whole near cache (near drops %d -> %d)", drops, ev.get(EventNearDrop))
}

// TestClosingAPerKeyCacheClosesItsReaders: the readers belong to the hub of
// the client, which lives while any near cache on it does. Once the last
// per-key cache is closed nothing reads through them, yet their
// connections stay open (and Redis keeps tracking what they read, sending
// its invalidations to the subscribed connection) for as long as another
// near cache, strict here, uses the client.
func TestClosingAPerKeyCacheClosesItsReaders(t *testing.T) {
	srv := redistest.PrivateServer(t, "it counts the readers' connections of the server")
	admin := redistest.Client(t, srv.Addr)
	rdb := redistest.Client(t, srv.Addr)
	p := redistest.Prefix(t, admin)
	agedRegistry(t, admin, p+"a:")
	strict, _ := newNearCacheOn(t, rdb, p+"s:") // the client's other near cache
	_ = strict
	perKey := New[product](rdb, WithPrefix(p+"a:"), WithNearCache(1<<20), WithEventualNearCache(time.Hour))
	t.Cleanup(func() { perKey.Close() })
	require.True(t, eventually(func() bool { return nearReady(perKey) }))
	require.NoError(t, perKey.Set(t.Context(), "k", product{ID: "v"}))
	warmNear(t, perKey, "k", "v")
	require.Positive(t, readerConnCount(t, admin), "no reader connection")

	require.NoError(t, perKey.Close())
	assert.True(t, eventually(func() bool { return readerConnCount(t, admin) == 0 }),
		"%d reader connections still open after the only per-key cache closed", readerConnCount(t, admin))
}
