// keys_test.go proves the naming of load locks: in the value's slot,
// one-to-one, and never a key the cache accepts as a value key.

package cache

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLockKeyIsInTheValueKeySlot(t *testing.T) {
	for _, key := range []string{
		"product:42", "{user:7}:profile", "a{b", "a}b", "{}x", "}{", "x{}y{z}",
		"{", "}", "tag{a}b}", "sp ace\n\x00bin", strings.Repeat("k", 10000), strings.Repeat("}", 100000),
	} {
		lk := LockKey(key)
		if lk == key {
			t.Errorf("LockKey(%q) = the key itself", key)
		}
		if got, want := specSlot(lk), specSlot(key); got != want {
			t.Errorf("LockKey(%q) = %q in slot %d; want the key's slot %d", key, lk, got, want)
		}
	}
	assert.Equal(t, "{5716}:stampede:lock:product:42", LockKey("product:42"))
}

// slot is Redis Cluster's key slot, written from the spec independently of
// keys.go.
func specSlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return slot.CRC16(key) % 16384
}

func TestCRC16MatchesRedis(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	assert.Equal(t, uint16(0x31C3), slot.CRC16("123456789"))
	assert.Equal(t, uint16(12182), slot.CRC16("foo")%16384)
}

func TestLockKeyMatchesRedisKeySlot(t *testing.T) {
	// Only a cluster-enabled server answers CLUSTER KEYSLOT (even before it has
	// slots): the test Redis if it is a cluster node, else a private one.
	rdb := redistest.Client(t, redistest.Addr(t))
	if err := rdb.ClusterKeySlot(t.Context(), "x").Err(); err != nil {
		srv := redistest.PrivateServer(t, "CLUSTER KEYSLOT needs a cluster-enabled Redis and the test Redis is not one ("+err.Error()+")",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
		rdb = redistest.Client(t, srv.Addr)
	}
	for _, key := range []string{"product:42", "{user:7}:profile", "a{b", "a}b", "{}x", "}{", "x{}y{z}", "sp ace\n\x00bin"} {
		want, err := rdb.ClusterKeySlot(t.Context(), key).Result()
		require.NoError(t, err)
		got, err := rdb.ClusterKeySlot(t.Context(), LockKey(key)).Result()
		require.NoError(t, err)
		if got != want {
			t.Errorf("Redis puts lock %q in slot %d; want the slot of %q, %d", LockKey(key), got, key, want)
		}
	}
}

// TestLockNamesAreOneToOne: "user:7" and "{user:7}" once shared a lock, so
// one blocked the other and a Delete of one voided the other's load.
func TestLockNamesAreOneToOne(t *testing.T) {
	keys := []string{"user:7", "{user:7}", "{user:7}:lock", "user:7}", "{user:7", "a}b", "{}a}b", "", "{", "}"}
	seen := map[string]string{}
	for _, k := range keys {
		lk := LockKey(k)
		if other, ok := seen[lk]; ok {
			t.Errorf("LockKey(%q) = LockKey(%q) = %q", k, other, lk)
		}
		seen[lk] = k
		if !isLockName(lk) {
			t.Errorf("isLockName(LockKey(%q)) = false", k)
		}
		if isLockName(k) {
			t.Errorf("isLockName(%q) = true for a value key", k)
		}
	}
}

// TestReservedKeysAreRejected: with WithPrefix("{shop}:") the lock of "item"
// was the value key of "item:lock"; once that was cached, "item" could never
// be loaded. Lock-shaped keys are now refused before anything reaches Redis.
func TestReservedKeysAreRejected(t *testing.T) {
	rdb, p := setup(t)
	c := New[string](rdb, WithPrefix("{"+p+"shop}:"))
	load := func(context.Context) (string, error) { return "v", nil }
	for _, k := range []string{"item:lock", "item", "lock:item"} {
		v, err := c.GetOrLoad(t.Context(), k, load)
		require.NoError(t, err, "GetOrLoad(%q)", k)
		assert.Equal(t, "v", v)
	}
	lock := LockKey("{" + p + "shop}:item")
	bare := New[string](rdb)
	_, err := bare.GetOrLoad(t.Context(), lock, load)
	assert.ErrorIs(t, err, ErrReservedKey, "GetOrLoad(%q)", lock)
	assert.ErrorIs(t, bare.Delete(t.Context(), lock), ErrReservedKey)
	assert.Zero(t, rdb.Exists(t.Context(), lock).Val(), "nothing may be written at a lock name")
}
