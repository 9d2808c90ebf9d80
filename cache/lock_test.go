// This file proves the naming of load locks and notification channels:
// in the value's slot, one-to-one, under the value key (or the prefix), and
// never a key the cache accepts as a value key.

package cache

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampede-go/stampede/internal/notify"
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
	assert.Equal(t, "product:42{5716}:stampede:lock", LockKey("product:42"))
	assert.Equal(t, "{user:7}:profile{}:stampede:lock", LockKey("{user:7}:profile"))
}

// TestLockKeysAreUnderTheValueKey: locks named "{T}:stampede:lock:key" fell
// outside a per-service ACL ("~product:*") and every call failed with
// NOPERM. A lock now starts with its value key, but for keys with a '{'
// that opens no hash tag.
func TestLockKeysAreUnderTheValueKey(t *testing.T) {
	for _, key := range []string{"product:42", "product:{7}", "{user:7}:profile", "a}b", ""} {
		if lk := LockKey(key); !strings.HasPrefix(lk, key) {
			t.Errorf("LockKey(%q) = %q; want it under the key", key, lk)
		}
	}
	for _, key := range []string{"a{b", "{}x", "{", "x{}y{z}"} {
		if lk := LockKey(key); !strings.HasPrefix(lk, "{") || !strings.HasSuffix(lk, key+"}") {
			t.Errorf("LockKey(%q) = %q; want \"{T}:stampede:lock\"+key+\"}\"", key, lk)
		}
	}
}

// TestChannelsAreUnderThePrefix: the one notification channel per slot was
// "{T}:stampede:notify", outside a per-service ACL ("&product:*"). It is now
// named under the cache's prefix, in the slot of the keys it announces,
// the prefix's hash tag included.
func TestChannelsAreUnderThePrefix(t *testing.T) {
	for _, tc := range []struct{ prefix, key, want string }{
		{"product:", "42", "product:{5716}:stampede:notify"},
		{"", "product:42", "{5716}:stampede:notify"},
		{"{shop}:", "item", "{shop}:{}:stampede:notify"},
	} {
		if got := notify.Channel(tc.prefix, tc.prefix+tc.key); got != tc.want {
			t.Errorf("notify.Channel(%q, %q) = %q; want %q", tc.prefix, tc.prefix+tc.key, got, tc.want)
		}
	}
	for _, prefix := range channelPrefixes {
		for _, k := range []string{"42", "{7}", "a{b", "}"} {
			key := prefix + k
			ch := notify.Channel(prefix, key)
			if got, want := specSlot(ch), specSlot(key); got != want {
				t.Errorf("notify.Channel(%q, %q) = %q in slot %d; want the key's slot %d", prefix, key, ch, got, want)
			}
			if !slot.StrayBrace(prefix) && !strings.HasPrefix(ch, prefix) {
				t.Errorf("notify.Channel(%q, %q) = %q; want it under the prefix", prefix, key, ch)
			}
		}
	}
}

// channelPrefixes are prefixes whose braces test the channel's naming.
var channelPrefixes = []string{"", "product:", "{shop}:", "a{b}:", "a}b:", "a{b:", "{}:", "{"}

// specSlot is Redis Cluster's key slot, written from the spec
// independently of internal/slot.
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
	t.Parallel()
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
	// Channels: a key's channel is in the key's slot, whatever the prefix.
	for _, prefix := range channelPrefixes {
		for _, k := range []string{"42", "{7}", "a{b", "}"} {
			key := prefix + k
			want, err := rdb.ClusterKeySlot(t.Context(), key).Result()
			require.NoError(t, err)
			got, err := rdb.ClusterKeySlot(t.Context(), notify.Channel(prefix, key)).Result()
			require.NoError(t, err)
			if got != want {
				t.Errorf("Redis puts channel %q in slot %d; want the slot of %q, %d", notify.Channel(prefix, key), got, key, want)
			}
		}
	}
}

// TestReservedKeysAreRejected: with WithPrefix("{shop}:") the lock of "item"
// was the value key of "item:lock"; once that was cached, "item" could never
// be loaded. Lock-shaped keys are now refused before anything reaches Redis.
func TestReservedKeysAreRejected(t *testing.T) {
	t.Parallel()
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
