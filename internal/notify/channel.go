// This file names the channels the commits and releases are announced on.

package notify

import (
	"strings"

	"github.com/stampede-go/stampede/internal/slot"
)

// infix follows the slot tag in every channel name.
const infix = ":stampede:notify"

// Channel is the channel on which the commit and the release of key's load
// lock are announced, for a cache with the given prefix: one channel per
// prefix and slot, in the slot of its keys, and under the prefix so that an
// ACL channel pattern that grants the prefix ("&product:*") grants it:
//
//   - prefix+"{T}:stampede:notify", T hashing to key's slot, when the prefix
//     has no '{' (the first '{' is then T's);
//   - prefix+"{}:stampede:notify" when the prefix has a hash tag: every key of
//     the cache is in the prefix's slot, and so is this one channel;
//   - "{T}:stampede:notify:"+prefix when the prefix has a '{' that opens no
//     hash tag: the one shape outside the prefix (no name starting with such a
//     prefix can be placed in a chosen slot).
func Channel(prefix, key string) string {
	switch {
	case slot.HasTag(prefix):
		return prefix + "{}" + infix
	case strings.IndexByte(prefix, '{') < 0:
		return prefix + "{" + slot.Tag(slot.Of(key)) + "}" + infix
	}
	return "{" + slot.Tag(slot.Of(key)) + "}" + infix + ":" + prefix
}
