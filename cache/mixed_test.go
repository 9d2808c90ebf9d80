// This file tests a writer without a near cache among readers with one:
// its writes wait for the readers' acknowledgements like any
// writer's, it holds no lease, and on a prefix without holders it opens no
// subscription and waits for nothing.

package cache

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trackingDialer dials connections that call before and after (nil: not)
// around each read once they turned client-side caching on: the near
// cache's tracking connections. Its other connections are untouched.
func trackingDialer(before, after func()) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		cn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &trackingConn{Conn: cn, before: before, after: after}, nil
	}
}

type trackingConn struct {
	net.Conn
	before, after func()
	tracking      atomic.Bool // the connection asked for CLIENT TRACKING
}

func (c *trackingConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("TRACKING")) {
		c.tracking.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *trackingConn) Read(b []byte) (int, error) {
	if c.tracking.Load() && c.before != nil {
		c.before()
	}
	n, err := c.Conn.Read(b)
	if c.tracking.Load() && c.after != nil {
		c.after()
	}
	return n, err
}

// slowTracking is a dialer whose tracking connections read each reply
// late: the reader's invalidations land delay after Redis sent them, as
// over a slow or busy link.
func slowTracking(delay time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return trackingDialer(func() { time.Sleep(delay) }, nil)
}

// mixedReader is a Cache with a near cache whose invalidations arrive late.
func mixedReader(t *testing.T, p string) *Cache[product] {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: slowTracking(20 * time.Millisecond)})
	t.Cleanup(func() { _ = rdb.Close() })
	c, _ := newNearCacheOn(t, rdb, p)
	return c
}

// TestWriterWithoutNearCacheWaitsForReaders: readers with near caches whose
// invalidations come 20ms late, a writer with WithoutNearCache() (an admin
// job configured differently): every read that begins after Set or Delete
// returned, through Get or GetOrLoad, gets the new value, and the writer
// is acknowledged, not made to wait out the readers' leases. Without the
// writer's confirmation most reads got the old value from memory.
func TestWriterWithoutNearCacheWaitsForReaders(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	readers := []*Cache[product]{mixedReader(t, p), mixedReader(t, p)}
	wev := &events{}
	w := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache(), wev.option())
	defer w.Close()
	// A registry older than a lease, or the first write waits out one
	// lease whatever the acknowledgements.
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())

	inMemory := func(r *Cache[product], want string) bool {
		v, err := r.Get(t.Context(), "k")
		return err == nil && v.ID == want && nearHas(r, "k")
	}
	const rounds = 30
	stale := 0
	for i := range rounds {
		old := "v" + strconv.Itoa(i)
		if i == 0 {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: old}))
		}
		for _, r := range readers {
			require.True(t, eventually(func() bool { return inMemory(r, old) }), "round %d: %q never reached a reader's memory", i, old)
		}
		next := "v" + strconv.Itoa(i+1)
		if i%5 == 4 { // a Delete, then the next value through a load
			require.NoError(t, w.Delete(t.Context(), "k"))
		} else {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: next}))
		}
		for j, r := range readers {
			var got product
			var err error
			if j == 0 {
				got, err = r.Get(t.Context(), "k")
				if i%5 == 4 { // deleted
					if !errors.Is(err, ErrCacheMiss) {
						require.NoError(t, err)
						stale++
					}
					continue
				}
			} else {
				got, err = r.GetOrLoad(t.Context(), "k", func(context.Context) (product, error) { return product{ID: next}, nil })
			}
			require.NoError(t, err)
			if got.ID != next {
				stale++
			}
		}
		if i%5 == 4 {
			require.NoError(t, w.Set(t.Context(), "k", product{ID: next}))
		}
	}
	assert.Zero(t, stale, "reads that began after the writer's Set or Delete returned and got the old value, in %d", rounds*len(readers))
	assert.Zero(t, wev.get(EventNearLeaseWait), "the writer waited out a reader's lease: acknowledgements did not reach it")
	assert.Zero(t, wev.get(EventNearHit), "a Cache without a near cache served from memory")
	n, err := admin.HLen(t.Context(), coherence.RegistryKey(p)).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1+len(readers), n, "the registry holds ~since and the readers' leases, not the writer")
}

// A writer without a near cache on a prefix that nobody holds: its writes
// open no subscription and wait for nothing but the registry's reply, in
// the same round trip as the write on a single server.
func TestWriterWithoutNearCacheAloneIsNotSlowed(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())
	rdb := redistest.Client(t, redistest.Addr(t))
	cmds := redistest.CountCommands(rdb)
	w := New[product](rdb, WithPrefix(p), WithoutNearCache())
	defer w.Close()
	for i := range 20 {
		require.NoError(t, w.Set(t.Context(), "k", product{ID: strconv.Itoa(i)}))
		require.NoError(t, w.Delete(t.Context(), "k"))
	}
	chans, err := admin.PubSubChannels(t.Context(), p+"stampede:near:ack:*").Result()
	require.NoError(t, err)
	assert.Empty(t, chans, "a writer with no holders to hear opened an acknowledgement subscription")
	assert.Zero(t, cmds.Count("subscribe"), "SUBSCRIBEs")
	assert.Zero(t, cmds.Count("publish"), "markers published again")
	ttl := admin.PTTL(t.Context(), coherence.RegistryKey(p)).Val()
	assert.Greater(t, ttl, 9*time.Minute, "the writers' registry is kept ten minutes past their last write")
}

// A writer without a near cache holds no lease: a write of a near-cached
// Cache is never made to wait for it, whether or not it wrote before.
func TestWriterWithoutNearCacheHoldsNoLease(t *testing.T) {
	t.Parallel()
	admin, p := setup(t)
	require.NoError(t, admin.HSet(t.Context(), coherence.RegistryKey(p), "~since", serverMillis(t, admin)-time.Second.Milliseconds()).Err())
	nw := New[product](redistest.Client(t, redistest.Addr(t)), WithPrefix(p), WithoutNearCache())
	defer nw.Close()
	require.NoError(t, nw.Set(t.Context(), "k", product{ID: "a"}))
	w, wev := newNearCacheOn(t, redistest.Client(t, redistest.Addr(t)), p)
	require.NoError(t, w.Set(t.Context(), "k", product{ID: "b"}))
	fields, err := admin.HKeys(t.Context(), coherence.RegistryKey(p)).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"~since", w.near.track.ID()}, fields)
	assert.Zero(t, wev.get(EventNearLeaseWait))
	assert.Nil(t, nw.near, "a Cache without a near cache keeps memory")
}
