// keys.go names the Redis keys the cache writes besides the values: the load
// lock of each value key, one-to-one, in the value's cluster slot, and of a
// shape no value key may take.

package cache

import (
	"strings"

	"github.com/stampede-go/stampede/internal/slot"
)

// lockInfix follows the slot tag in every lock name: "{T}:stampede:lock:key".
const lockInfix = ":stampede:lock:"

// LockKey returns the Redis key of the load lock that [Cache.GetOrLoad] takes
// for the value stored at valueKey (the full key, prefix included), for
// operators and tests. It is "{T}:stampede:lock:" followed by valueKey, where
// T is a short string that Redis Cluster hashes to valueKey's slot: the lock
// is in the value's slot, distinct for every value key, and never equal to a
// key the cache accepts (see [ErrReservedKey]).
func LockKey(valueKey string) string {
	return "{" + slot.Tag(slot.Of(valueKey)) + "}" + lockInfix + valueKey
}

// isLockName reports whether key has the shape of a lock name, which value
// keys may not take, so that no value can be stored where a lock lives.
func isLockName(key string) bool {
	if len(key) == 0 || key[0] != '{' {
		return false
	}
	end := strings.IndexByte(key, '}')
	return end > 0 && strings.HasPrefix(key[end+1:], lockInfix)
}
