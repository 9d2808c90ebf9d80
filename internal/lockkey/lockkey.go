// Package lockkey names the load lock of each value key, one-to-one, in the
// value's cluster slot, under the value key itself (so under the cache's
// prefix and its ACL pattern), and of a shape no value key may take; and
// tells lock names apart from value keys.
package lockkey

import (
	"strings"

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
