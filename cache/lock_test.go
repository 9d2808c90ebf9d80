// lock_test.go proves the standalone Lock and the naming of load locks.

package cache

import (
	"context"
	"testing"
	"time"

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

func TestTokensAreRandom(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := newToken()
		require.Len(t, tok, 32)
		require.False(t, seen[tok], "token repeated")
		seen[tok] = true
	}
}
