// registry_test.go tests where leases are registered: a name Redis does not
// report to the holders, the registry of earlier versions kept in step
// during a rolling upgrade, and the fallback when an ACL refuses the name.

package coherence

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The registry shares its slot and Ring shard (its hash tag's text) with
// the marker keys and the earlier versions' registry, does not begin with
// its prefix, and is told apart from value keys.
func TestRegistryKey(t *testing.T) {
	for _, p := range []string{"product:", "", "p{x}:", "a{b:"} {
		k := RegistryKey(p)
		assert.False(t, p != "" && strings.HasPrefix(k, p), "%q begins with its prefix %q", k, p)
		tag := func(s string) string { _, rest, _ := strings.Cut(s, "{"); t, _, _ := strings.Cut(rest, "}"); return t }
		for _, other := range []string{LegacyRegistryKey(p), MarkKeyPrefix(p) + "w:1"} {
			assert.Equal(t, slot.Of(other), slot.Of(k), "%q and %q in different slots", k, other)
			assert.Equal(t, tag(other), tag(k), "%q and %q on different Ring shards", k, other)
		}
		assert.True(t, IsRegistry(k), "IsRegistry(%q)", k)
	}
	for _, k := range []string{"product:k", "{x}:stampede:near:product:", "{", "{1}", LegacyRegistryKey("product:")} {
		assert.False(t, IsRegistry(k), "IsRegistry(%q)", k)
	}
}

// invalidations subscribes a connection of its own to the invalidations of
// every key under p (as a tracking connection of another process would)
// and counts those that arrive.
func invalidations(t *testing.T, addr, p string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, PoolSize: 1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			id, err := cn.ClientID(ctx).Result()
			if err != nil {
				return err
			}
			return cn.Process(ctx, redis.NewCmd(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", p)) // no Do on a Conn of go-redis 9.5
		}})
	sub := rdb.Subscribe(t.Context(), invalidateChannel)
	_, err := sub.Receive(t.Context())
	require.NoError(t, err)
	go func() {
		for m := range sub.Channel() {
			n.Add(int64(len(m.PayloadSlice) + len(m.Payload)))
		}
	}()
	t.Cleanup(func() { _ = sub.Close(); _ = rdb.Close() })
	return &n
}

// Lease renewals write no key under the prefix: with the registry under it,
// Redis reported every renewal of every process to every tracking
// connection of the prefix (N² messages a second). Unless the registry of
// earlier versions exists, which a holder then renews as they do.
func TestRenewalsAreNotReported(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	heard := invalidations(t, addr, p)
	lease := 200 * time.Millisecond // a renewal every 50 ms
	a := New(redistest.Client(t, addr), p, lease, Hooks{})
	defer a.Close()
	b := New(redistest.Client(t, addr), p, lease, Hooks{})
	defer b.Close()
	require.True(t, eventually(a.Serving) && eventually(b.Serving), "never serving")
	before := heard.Load()
	time.Sleep(4 * lease) // 16 renewals each
	assert.Zero(t, heard.Load()-before, "renewals reported under the prefix")
	assert.Zero(t, admin.Exists(t.Context(), LegacyRegistryKey(p)).Val(), "the registry of earlier versions made")

	// An older process's registry appears: both holders renew there too, as
	// the older processes do, and are heard again.
	require.NoError(t, admin.HSet(t.Context(), LegacyRegistryKey(p), "~since", 0).Err())
	require.NoError(t, admin.PExpire(t.Context(), LegacyRegistryKey(p), time.Minute).Err())
	for _, tr := range []*Tracker{a, b} {
		assert.True(t, eventually(func() bool { return admin.HExists(t.Context(), LegacyRegistryKey(p), tr.ID()).Val() }),
			"a holder not in the registry that writers of earlier versions read")
	}
	assert.Positive(t, admin.PTTL(t.Context(), LegacyRegistryKey(p)).Val(), "the older registry's expiry was lost")
}

// A holder of an earlier version, registered only where those versions
// register, is waited for by a writer of this one (here it never
// acknowledges, so its lease is waited out); and a holder listed in both
// registries counts once.
func TestWriterWaitsForHoldersOfEarlierVersions(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	wrdb := redistest.Client(t, addr)
	var lapsed atomic.Value
	w := NewWriter(wrdb, p, time.Second, Hooks{OnLapse: func(h string) { lapsed.Store(h) }})
	defer w.Close()
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0).Err()) // no grace for a new registry
	now := time.Now()
	srv, err := admin.Time(t.Context()).Result()
	require.NoError(t, err)
	end := srv.Add(300 * time.Millisecond).UnixMilli()
	require.NoError(t, admin.HSet(t.Context(), LegacyRegistryKey(p), "~since", 0, "old", end).Err())
	write(t, w, wrdb, p+"k", 1)
	assert.Equal(t, "old", lapsed.Load(), "the older holder was not waited for")
	assert.GreaterOrEqual(t, time.Since(now), 200*time.Millisecond, "returned long before the older holder's lease ended")

	reply, err := confirmScript.Run(t.Context(), wrdb, w.registries(), "", "x:1").Slice()
	require.NoError(t, err)
	_, _, leases, err := parseLeases(append(reply, "old", end+5))
	require.NoError(t, err)
	assert.Equal(t, end+5, leases["old"], "a holder listed twice: not the later lease end")
}

// A writer forgets the holders gone a minute (they died without Close), as
// it reads the registry, and keeps the others.
func TestWriterForgetsHoldersLongGone(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	wrdb := redistest.Client(t, addr)
	w := NewWriter(wrdb, p, time.Second, Hooks{})
	defer w.Close()
	srv, err := admin.Time(t.Context()).Result()
	require.NoError(t, err)
	now := srv.UnixMilli()
	require.NoError(t, admin.HSet(t.Context(), RegistryKey(p), "~since", 0, "gone", now-61_000, "recent", now-1_000).Err())
	write(t, w, wrdb, p+"k", 1)
	fields, err := admin.HKeys(t.Context(), RegistryKey(p)).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"~since", "recent"}, fields)
}
