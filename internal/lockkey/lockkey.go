// Package lockkey names the load lock of each value key, one-to-one, in the
// value's cluster slot, under the value key itself (so under the cache's
// prefix and its ACL pattern), and of a shape no value key may take; and
// tells lock names apart from value keys.
package lockkey

import (
	"github.com/stampede-go/stampede/internal/slot"
)

// lockSuffix names a value key's load lock (see slot.Companion).
const lockSuffix = ":stampede:lock"

// Of is the load lock of valueKey (see cache.LockKey).
func Of(valueKey string) string { return slot.Companion(valueKey, lockSuffix) }

// Is reports whether key is the lock name of some value key, which
// value keys may not take, so that no value can be stored where a lock
// lives. It inverts Of exactly: keys that only look alike (a wrong slot
// tag, say) stay usable.
func Is(key string) bool {
	_, ok := slot.CompanionOf(key, lockSuffix)
	return ok
}
