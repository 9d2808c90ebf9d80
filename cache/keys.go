// keys.go names the Redis keys the cache writes besides the values: the load
// lock of each value key, one-to-one, in the value's cluster slot, under the
// value key itself (so under the cache's prefix and its ACL pattern), and of
// a shape no value key may take.

package cache

import (
	"strings"

	"github.com/stampede-go/stampede/internal/slot"
)

// lockSuffix names a value key's load lock (see slot.Companion).
const lockSuffix = ":stampede:lock"

// LockKey returns the Redis key of the load lock that [Cache.GetOrLoad] takes
// for the value stored at valueKey (the full key, prefix included), for
// operators and tests. It is valueKey+"{T}:stampede:lock", where T is a short
// string that Redis Cluster hashes to valueKey's slot, or
// valueKey+"{}:stampede:lock" when valueKey has a hash tag (which then keeps
// deciding the slot). Both start with valueKey, so an ACL key pattern that
// grants the values ("~product:*") grants their locks. The one exception is a
// key with a '{' that opens no hash tag ("a{b"): its lock is
// "{T}:stampede:lock"+valueKey+"}", outside the prefix. The lock is in the
// value's slot, distinct for every value key, and never equal to a key the
// cache accepts (see [ErrReservedKey]).
func LockKey(valueKey string) string {
	return slot.Companion(valueKey, lockSuffix)
}

// isLockName reports whether key is the lock name of some value key, which
// value keys may not take, so that no value can be stored where a lock
// lives. It inverts slot.Companion exactly: keys that only look alike (a
// wrong slot tag, say) stay usable.
func isLockName(key string) bool {
	// key+"{}"+suffix, key with a hash tag.
	if v, ok := strings.CutSuffix(key, "{}"+lockSuffix); ok && slot.HasTag(v) {
		return true
	}
	// key+"{T}"+suffix, key without '{': the first '{' opens T.
	if v, ok := strings.CutSuffix(key, "}"+lockSuffix); ok {
		if i := strings.IndexByte(v, '{'); i >= 0 && v[i+1:] == slot.Tag(slot.Of(v[:i])) {
			return true
		}
	}
	// "{T}"+suffix+key+"}", key with a '{' that opens no tag.
	if rest, ok := strings.CutPrefix(key, "{"); ok {
		if j := strings.IndexByte(rest, '}'); j > 0 {
			if v, ok := strings.CutPrefix(rest[j+1:], lockSuffix); ok {
				if v, ok := strings.CutSuffix(v, "}"); ok && strings.Contains(v, "{") && !slot.HasTag(v) &&
					rest[:j] == slot.Tag(slot.Of(v)) {
					return true
				}
			}
		}
	}
	return false
}
