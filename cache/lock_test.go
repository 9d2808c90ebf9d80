// lock_test.go proves the standalone Lock and the naming of load locks.

package cache

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestObtainReleaseRefresh(t *testing.T) {
	rdb, p := setup(t)
	key := p + "job:nightly"

	l, err := Obtain(t.Context(), rdb, key, WithLockTTL(time.Second))
	require.NoError(t, err)
	assert.Equal(t, key, l.Key())
	assert.Equal(t, l.Token(), rdb.Get(t.Context(), key).Val(), "the key must hold the holder's token")

	_, err = Obtain(t.Context(), rdb, key, WithRetry(2, 10*time.Millisecond))
	assert.ErrorIs(t, err, ErrLockNotAcquired, "a second holder must not get a held lock")

	require.NoError(t, l.Refresh(t.Context(), time.Minute))
	assert.Greater(t, rdb.PTTL(t.Context(), key).Val(), 50*time.Second)

	require.NoError(t, l.Release(t.Context()))
	assert.Zero(t, rdb.Exists(t.Context(), key).Val())
	assert.ErrorIs(t, l.Release(t.Context()), ErrLockNotHeld)
	assert.ErrorIs(t, l.Refresh(t.Context(), time.Second), ErrLockNotHeld)
}

func TestLockOwnerChecks(t *testing.T) {
	rdb, p := setup(t)
	key := p + "submit:user42"
	l, err := Obtain(t.Context(), rdb, key, WithLockTTL(50*time.Millisecond))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // the lease runs out...
	other, err := Obtain(t.Context(), rdb, key)
	require.NoError(t, err, "...and another holder takes it")

	assert.ErrorIs(t, l.Release(t.Context()), ErrLockNotHeld, "a stale holder must not release the new holder's lock")
	assert.ErrorIs(t, l.Refresh(t.Context(), time.Minute), ErrLockNotHeld)
	assert.Equal(t, other.Token(), rdb.Get(t.Context(), key).Val())
	require.NoError(t, other.Release(t.Context()))
}

func TestObtainWaitsForRelease(t *testing.T) {
	rdb, p := setup(t)
	key := p + "k"
	l, err := Obtain(t.Context(), rdb, key)
	require.NoError(t, err)
	go func() { time.Sleep(100 * time.Millisecond); _ = l.Release(context.Background()) }()
	l2, err := Obtain(t.Context(), rdb, key, WithRetry(100, 10*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, l2.Release(t.Context()))
}

func TestObtainContextEndsWait(t *testing.T) {
	rdb, p := setup(t)
	key := p + "k"
	_, err := Obtain(t.Context(), rdb, key)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = Obtain(ctx, rdb, key, WithRetry(1000, 10*time.Millisecond))
	assert.ErrorIs(t, err, ErrLockNotAcquired)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestObtainBadInput(t *testing.T) {
	rdb, _ := setup(t)
	_, err := Obtain(t.Context(), rdb, "")
	assert.ErrorIs(t, err, ErrEmptyKey)
	assert.Panics(t, func() { _, _ = Obtain(t.Context(), rdb, "k", WithLockTTL(0)) })
}

func TestLockKeyIsInTheValueKeySlot(t *testing.T) {
	for _, key := range []string{
		"product:42", "{user:7}:profile", "a{b", "a}b", "{}x", "}{", "x{}y{z}",
		"{", "}", "tag{a}b}", "sp ace\n\x00bin", strings.Repeat("k", 10000), strings.Repeat("}", 100000),
	} {
		lk := lockKey(key)
		if lk == key {
			t.Errorf("lockKey(%q) = the key itself", key)
		}
		if got, want := slot(lk), slot(key); got != want {
			t.Errorf("lockKey(%q) = %q in slot %d; want the key's slot %d", key, lk, got, want)
		}
	}
	assert.Equal(t, "{product:42}:lock", lockKey("product:42"))
	assert.Equal(t, "{user:7}:profile:lock", lockKey("{user:7}:profile"))
}

// slot is Redis Cluster's key slot, written from the spec independently of
// hasHashTag.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % 16384
}

func TestCRC16MatchesRedis(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	assert.Equal(t, uint16(0x31C3), crc16("123456789"))
	assert.Equal(t, uint16(12182), crc16("foo")%16384)
}

func TestTokensAreRandom(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := newToken()
		require.Len(t, tok, 32)
		require.False(t, seen[tok], "token repeated")
		seen[tok] = true
	}
}

func TestLockKeyMatchesRedisKeySlot(t *testing.T) {
	// A cluster-enabled server answers CLUSTER KEYSLOT even before it has slots.
	srv := redistest.NewServer(t, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
	rdb := redistest.Client(t, srv.Addr)
	for _, key := range []string{"product:42", "{user:7}:profile", "a{b", "a}b", "{}x", "}{", "x{}y{z}", "sp ace\n\x00bin"} {
		want, err := rdb.ClusterKeySlot(t.Context(), key).Result()
		require.NoError(t, err)
		got, err := rdb.ClusterKeySlot(t.Context(), lockKey(key)).Result()
		require.NoError(t, err)
		if got != want {
			t.Errorf("Redis puts lock %q in slot %d; want the slot of %q, %d", lockKey(key), got, key, want)
		}
	}
}
