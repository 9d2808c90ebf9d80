package coherence

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// perKeyTracker starts a per-key tracker of prefix p on a client of its
// own, whose globals are p+"g:", and waits until it is sure. drops counts
// its drops of everything.
func perKeyTracker(t *testing.T, addr, p string, drops *atomic.Int64) (*Tracker, *redis.Client) {
	t.Helper()
	rdb := redistest.Client(t, addr)
	hub := NewHub(rdb)
	t.Cleanup(hub.Close)
	tr := hub.NewPerKey(p, p+"g:", time.Second, Hooks{
		OnDrop: func(key string, all bool) {
			if all && drops != nil {
				drops.Add(1)
			}
		},
		Global: func(key string) bool { return strings.HasPrefix(key, p+"g:") },
	})
	t.Cleanup(tr.Close)
	require.True(t, eventually(tr.Sure), "the per-key tracker never became sure")
	return tr, rdb
}

// otherStripe returns a key under p whose stripe is not key's: a ticket of
// one is not voided by the other's invalidation.
func otherStripe(tr *Tracker, p, key string) string {
	for i := 0; ; i++ {
		k := p + "other" + strings.Repeat("x", i)
		if tr.stripe(k) != tr.stripe(key) {
			return k
		}
	}
}

// A per-key tracker hears the writes of the keys read through its reader,
// and not those of keys it did not read, nor of keys read through the
// user's client: a write costs the processes that read its key. (Redis
// sends a client's invalidations in order on its redirect connection: once
// the last write's has come, an earlier one would have too.)
func TestPerKeyTrackerHearsOnlyTheKeysItsReaderRead(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	tr, rdb := perKeyTracker(t, addr, p, nil)
	read, unread := p+"read", otherStripe(tr, p, p+"read")
	byUser := otherStripe(tr, p, unread) + "u"
	for _, k := range []string{read, unread, byUser} {
		require.NoError(t, admin.Set(t.Context(), k, "v0", 0).Err())
	}
	reader := tr.ReadVia(rdb)
	require.NotNil(t, reader, "no reader for the server")
	require.NoError(t, reader.Get(t.Context(), read).Err())
	require.NoError(t, rdb.Get(t.Context(), byUser).Err())
	tkRead, tkUnread, tkUser := tr.Ticket(read), tr.Ticket(unread), tr.Ticket(byUser)
	if tr.stripe(byUser) == tr.stripe(read) {
		t.Skip("the user's key shares the read key's stripe")
	}

	for range 5 {
		require.NoError(t, admin.Set(t.Context(), unread, "v1", 0).Err())
		require.NoError(t, admin.Set(t.Context(), byUser, "v1", 0).Err())
	}
	require.NoError(t, admin.Set(t.Context(), read, "v1", 0).Err())
	require.True(t, eventually(func() bool { return tr.Invalidated(tkRead) }), "the write of a key read through the reader was not heard")
	assert.False(t, tr.Invalidated(tkUnread), "a write of a key nobody read reached the tracker")
	assert.False(t, tr.Invalidated(tkUser), "a key read through the user's client was tracked")
	assert.True(t, tr.Valid(tkUnread), "a ticket of an unwritten key's stripe was voided")
}

// The keys under globals (the tag and Clear versions) are heard whoever
// read them: values in memory depend on them.
func TestPerKeyTrackerHearsEveryWriteOfItsGlobals(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	var drops atomic.Int64
	tr, _ := perKeyTracker(t, addr, p, &drops)
	tk := tr.Ticket(p + "k")
	before := drops.Load()
	require.NoError(t, admin.Set(t.Context(), p+"g:version", 1, 0).Err())
	assert.True(t, eventually(func() bool { return drops.Load() > before }), "a global key's write was not heard")
	assert.False(t, tr.Valid(tk), "a read in flight survived a global key's write")
}

// readerConns returns the CLIENT IDs of the readers' connections.
func readerConns(t *testing.T, admin *redis.Client) []int64 {
	t.Helper()
	list, err := admin.ClientList(t.Context()).Result()
	require.NoError(t, err)
	var ids []int64
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+ReaderName+" ") {
			var id int64
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "id="); ok {
					id, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			ids = append(ids, id)
		}
	}
	return ids
}

// readThenKillTheReaders starts a per-key tracker, reads p+"k" through its
// reader, takes a ticket of it (tk), and has Redis kill the reader's
// connections; before is the drops of everything counted before the kill.
func readThenKillTheReaders(t *testing.T) (tr *Tracker, rdb *redis.Client, p string, tk Ticket, drops *atomic.Int64, before int64) {
	t.Helper()
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p = redistest.Prefix(t, admin)
	drops = new(atomic.Int64)
	tr, rdb = perKeyTracker(t, addr, p, drops)
	readThrough(t, tr.ReadVia(rdb), p+"k")
	ids := readerConns(t, admin)
	require.NotEmpty(t, ids, "no reader connection in CLIENT LIST")
	tk, before = tr.Ticket(p+"k"), drops.Load()
	for _, id := range ids {
		require.NoError(t, admin.ClientKillByFilter(t.Context(), "ID", strconv.FormatInt(id, 10)).Err())
	}
	return tr, rdb, p, tk, drops, before
}

// What a reader's connection read is tracked only while it lives: once the
// process sees it closed, memory is dropped and reads in flight are void.
// Here Redis kills it; the next read through the reader finds it dead.
func TestAClosedReaderConnectionDropsMemory(t *testing.T) {
	tr, rdb, p, tk, drops, before := readThenKillTheReaders(t)
	_ = tr.ReadVia(rdb).Get(t.Context(), p+"k").Err() // fails, or succeeds on a new connection
	assert.Greater(t, drops.Load(), before, "a reader connection closed without a drop of memory")
	assert.False(t, tr.Valid(tk), "a read in flight survived its connection's close")
}

// readThrough reads key through c, a reader.
func readThrough(t *testing.T, c *redis.Client, key string) {
	t.Helper()
	require.NotNil(t, c, "no reader")
	if err := c.Get(t.Context(), key).Err(); err != redis.Nil {
		require.NoError(t, err)
	}
}

// The reader redirects to the subscribed connection: when that one is
// replaced (killed here, a new CLIENT ID), the reader is replaced too, or
// the invalidations of what it reads would go to a client that is gone.
func TestTheReaderFollowsItsSubscribedConnection(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t, addr)
	p := redistest.Prefix(t, admin)
	tr, rdb := perKeyTracker(t, addr, p, nil)
	old := tr.ConnIDs()
	require.Len(t, old, 1)
	require.NoError(t, admin.ClientKillByFilter(t.Context(), "ID", strconv.FormatInt(old[0], 10)).Err())
	require.True(t, eventually(func() bool { ids := tr.ConnIDs(); return ids[0] != old[0] && tr.Sure() }), "the subscribed connection never came back")

	// The hub may start over more than once before it settles (a reader
	// bound to a connection replaced since fails to connect, and its reads
	// fall back); once it has, a read through the reader is heard.
	heard := eventually(func() bool {
		rdr := tr.ReadVia(rdb)
		if !tr.Sure() || rdr == nil {
			return false
		}
		if err := rdr.Get(t.Context(), p+"k").Err(); err != nil && err != redis.Nil {
			return false
		}
		tk := tr.Ticket(p + "k")
		require.NoError(t, admin.Set(t.Context(), p+"k", 1, 0).Err())
		return redistest.Eventually(time.Second, func() bool { return tr.Invalidated(tk) })
	})
	assert.True(t, heard, "a read through the reader after the subscription was replaced is not heard")
}

// A reader connection the server closed while idle (its timeout, a kill)
// is seen by the client only when next used, and what it read is no longer
// tracked: the hub's check asks the server for the readers' connections
// and drops memory when one is gone, without waiting for that use.
func TestAnIdleReaderConnectionClosedByTheServerDropsMemory(t *testing.T) {
	tr, _, _, tk, drops, before := readThenKillTheReaders(t)
	assert.True(t, eventually(func() bool { return drops.Load() > before }), "an idle reader connection closed by the server went unnoticed")
	assert.False(t, tr.Valid(tk), "a read in flight survived its connection's close")
}
