// This file proves the fencing token against a real Redis: it grows with
// every acquisition from any client, a stale holder's is smaller than its
// successor's so a fenced store refuses it, it is taken in the same script as
// the lock, and its counter shares the lock key's slot and prefix.

package lock

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fencedRow is a store record that keeps the fence of the last write it
// accepted, as UPDATE ... SET v = $2, fence = $1 WHERE id = $3 AND fence < $1.
type fencedRow struct {
	mu    sync.Mutex // protects v and fence
	v     string
	fence int64
}

func (r *fencedRow) write(fence int64, v string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence <= r.fence {
		return false
	}
	r.v, r.fence = v, fence
	return true
}

// TestFenceGrowsAcrossClients: several processes (one client each) take the
// same lock in turn; in the order they held it, their fences strictly grow.
func TestFenceGrowsAcrossClients(t *testing.T) {
	_, p := setup(t)
	key := p + "sku-1"
	const clients, rounds = 4, 15
	type turn struct {
		seq   int64 // the order in which the lock was held
		fence int64
	}
	var (
		seq   atomic.Int64
		mu    sync.Mutex // protects turns
		turns []turn
		wg    sync.WaitGroup
	)
	retry := WithRetry(LimitRetry(ExponentialBackoff(time.Millisecond, 20*time.Millisecond), 1000))
	for range clients {
		c := redistest.Client(t, redistest.Addr(t))
		wg.Go(func() {
			for range rounds {
				l, err := Obtain(t.Context(), c, key, 5*time.Second, retry)
				if !assert.NoError(t, err) {
					return
				}
				tr := turn{seq.Add(1), l.Fence()}
				assert.NoError(t, l.Release(t.Context()))
				mu.Lock()
				turns = append(turns, tr)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, turns, clients*rounds)
	slices.SortFunc(turns, func(a, b turn) int { return int(a.seq - b.seq) })
	for i := 1; i < len(turns); i++ {
		if turns[i].fence <= turns[i-1].fence {
			t.Errorf("holder %d has fence %d, holder %d before it %d; want a larger fence for every later holder",
				turns[i].seq, turns[i].fence, turns[i-1].seq, turns[i-1].fence)
		}
	}
	assert.Equal(t, int64(clients*rounds), turns[len(turns)-1].fence, "the counter starts at 0 and counts every acquisition")
}

// TestFenceRefusesStaleHolder: A's lease runs out while it stalls and B takes
// the lock; B's fence is larger, so a store that keeps the last fence accepts
// B's write and refuses A's, which comes after it.
func TestFenceRefusesStaleHolder(t *testing.T) {
	rdb, p := setup(t)
	key := p + "stock:sku-1"
	a, err := Obtain(t.Context(), rdb, key, 50*time.Millisecond)
	require.NoError(t, err)
	require.Positive(t, a.Fence())
	time.Sleep(100 * time.Millisecond) // A stalls past its lease
	b, err := Obtain(t.Context(), rdb, key, time.Minute)
	require.NoError(t, err)
	if b.Fence() <= a.Fence() {
		t.Fatalf("new holder's fence %d <= stale holder's %d; want larger", b.Fence(), a.Fence())
	}

	var row fencedRow
	assert.True(t, row.write(b.Fence(), "written by B"), "the holder's write must be accepted")
	assert.False(t, row.write(a.Fence(), "written by A"), "the stale holder's write must be refused")
	assert.Equal(t, "written by B", row.v)
	assert.ErrorIs(t, a.Release(t.Context()), ErrNotHeld)
	require.NoError(t, b.Release(t.Context()))
}

// TestFenceOnlyOnAcquisition: the counter moves with the lock and only with
// it, in the one script that takes the lock: a refused attempt leaves it, the
// counter holds the fence just handed out, and never expires.
func TestFenceOnlyOnAcquisition(t *testing.T) {
	rdb, p := setup(t)
	key := p + "job"
	l, err := Obtain(t.Context(), rdb, key, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, fenceKey(key), l.FenceKey())
	got, err := rdb.Get(t.Context(), l.FenceKey()).Int64()
	require.NoError(t, err)
	assert.Equal(t, l.Fence(), got, "the counter must hold the fence Obtain returned")
	assert.Equal(t, time.Duration(-1), rdb.PTTL(t.Context(), l.FenceKey()).Val(), "the counter must not expire")

	_, err = Obtain(t.Context(), rdb, key, time.Minute)
	require.ErrorIs(t, err, ErrNotObtained)
	after, err := rdb.Get(t.Context(), l.FenceKey()).Int64()
	require.NoError(t, err)
	assert.Equal(t, got, after, "a refused attempt must not move the counter")
	require.NoError(t, l.Release(t.Context()))
}

// TestFenceIsTakenInTheObtainScript: Obtain sends only the obtain script,
// naming the lock key and its counter, so that the lock and the fence are
// taken atomically; no INCR goes out on its own.
func TestFenceIsTakenInTheObtainScript(t *testing.T) {
	_, p := setup(t)
	c := redistest.Client(t, redistest.Addr(t))
	require.NoError(t, c.Ping(t.Context()).Err()) // the connection's HELLO goes before the log
	sent := redistest.RecordRounds(c)
	key := p + "atomic"
	l, err := Obtain(t.Context(), c, key, time.Minute)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
	cmds := sent.Args()
	cmds = cmds[:len(cmds)-1] // the release
	require.NotEmpty(t, cmds)
	for _, args := range cmds {
		require.Greater(t, len(args), 4, "command %v", args)
		assert.True(t, args[1] == lockObtainScript.Hash() || args[1] == lockObtainLua,
			"Obtain sent %v; want only the obtain script", args[0])
		assert.Equal(t, []any{2, key, fenceKey(key)}, args[2:5], "the script must name the lock key and its counter")
	}
}

// TestFenceWithToken: obtaining again with the token that holds the lock is a
// new acquisition with a new, larger fence; the earlier one is now stale.
func TestFenceWithToken(t *testing.T) {
	rdb, p := setup(t)
	key := p + "worker"
	first, err := Obtain(t.Context(), rdb, key, time.Minute, WithToken("worker-7"))
	require.NoError(t, err)
	again, err := Obtain(t.Context(), rdb, key, time.Minute, WithToken("worker-7"), WithMetadata("restarted"))
	require.NoError(t, err, "the token's holder may obtain its lock again")
	assert.Equal(t, first.Fence()+1, again.Fence(), "a re-entrant obtain must take the next fence")

	var row fencedRow
	assert.True(t, row.write(again.Fence(), "restarted"))
	assert.False(t, row.write(first.Fence(), "before the restart"), "writes under the earlier acquisition must be refused")
	require.NoError(t, again.Release(t.Context()))
}

// TestFenceCounterNotAnInteger: a counter that cannot be incremented makes
// Obtain fail with a Redis error that names it, and leaves the lock untaken.
func TestFenceCounterNotAnInteger(t *testing.T) {
	rdb, p := setup(t)
	key := p + "broken"
	require.NoError(t, rdb.Set(t.Context(), fenceKey(key), "not a number", 0).Err())
	_, err := Obtain(t.Context(), rdb, key, time.Minute)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.Contains(t, err.Error(), "fencing counter "+fenceKey(key))
	assert.Zero(t, rdb.Exists(t.Context(), key).Val(), "the lock must not be taken without its fence")
}

// TestFenceQuorumIsZero: a quorum lock has no fence and its round increments
// no counter on any master.
func TestFenceQuorumIsZero(t *testing.T) {
	_, p := setup(t)
	masters, clients := quorumOf3(t, p)
	key := p + "invoice-run"
	l, err := ObtainQuorum(t.Context(), masters, key, 10*time.Second)
	require.NoError(t, err)
	assert.Zero(t, l.Fence())
	assert.Empty(t, l.FenceKey())
	for i, c := range clients {
		assert.Zero(t, c.Exists(t.Context(), fenceKey(key)).Val(), "master %d has a fencing counter", i)
	}
	require.NoError(t, l.Release(t.Context()))
}

func TestFenceNilAndContext(t *testing.T) {
	var l *Lock
	assert.Zero(t, l.Fence())
	assert.Empty(t, l.FenceKey())
	assert.Nil(t, FromContext(t.Context()))

	rdb, p := setup(t)
	var inside *Lock
	require.NoError(t, Do(t.Context(), rdb, p+"do", time.Minute, func(ctx context.Context) error {
		inside = FromContext(ctx)
		return nil
	}))
	require.NotNil(t, inside, "Do's function must find its lock in its context")
	assert.Positive(t, inside.Fence())
	assert.Equal(t, p+"do", inside.Key())
}

// TestFenceCounterSharesSlotAndPrefix: for odd keys, with and without a
// prefix, the counter is in the lock key's cluster slot (as a cluster-enabled
// Redis computes it) and starts with the lock key unless the key has a stray
// '{'; and the obtain script, which names both keys, runs on a cluster node
// without CROSSSLOT.
func TestFenceCounterSharesSlotAndPrefix(t *testing.T) {
	srv := redistest.PrivateServer(t, "CLUSTER KEYSLOT and CROSSSLOT need a cluster-enabled Redis of our own",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
	rdb := redistest.Client(t, srv.Addr)
	slots := make([]int, 16384)
	for i := range slots {
		slots[i] = i
	}
	require.NoError(t, rdb.ClusterAddSlots(t.Context(), slots...).Err())
	require.Eventually(t, func() bool {
		return strings.Contains(rdb.ClusterInfo(t.Context()).Val(), "cluster_state:ok")
	}, 20*time.Second, 20*time.Millisecond, "the one-node cluster must come up")

	keys := []string{"product:42", "{user:7}:profile", "a{b", "a}b", "{}x", "}{", "x{}y{z}", "{", "}",
		"sp ace\n\x00bin", strings.Repeat("long:", 200)}
	for _, prefix := range []string{"", "myapp:lock:", "{tenant-9}:", "odd{"} {
		for _, key := range keys {
			l, err := Obtain(t.Context(), rdb, key, time.Minute, WithPrefix(prefix))
			require.NoError(t, err, "Obtain(%q) with prefix %q on a cluster node", key, prefix)
			lk, fk := l.Key(), l.FenceKey()
			want, err := rdb.ClusterKeySlot(t.Context(), lk).Result()
			require.NoError(t, err)
			got, err := rdb.ClusterKeySlot(t.Context(), fk).Result()
			require.NoError(t, err)
			if got != want {
				t.Errorf("Redis puts counter %q in slot %d; want the slot of lock %q, %d", fk, got, lk, want)
			}
			if !slot.StrayBrace(lk) && !strings.HasPrefix(fk, lk) {
				t.Errorf("counter %q does not start with lock key %q", fk, lk)
			}
			require.NoError(t, l.Release(t.Context()))
		}
	}
}
