// keys.go names the protocol's keys and channels, which older versions read too.

package coherence

import "github.com/stampede-go/stampede/internal/slot"

// invalidateChannel is where Redis sends RESP2 tracking invalidations.
const invalidateChannel = "__redis__:invalidate"

// RegistryKey is the lease registry of the near caches of prefix: a hash
// of holder id to lease end, in the server's milliseconds, and "~since" to
// when the registry was created. It is under the prefix, so that ACL key
// patterns granting the prefix grant it, and its shape is one no value key
// may take: the cache refuses it as a key.
func RegistryKey(prefix string) string {
	return slot.Companion(prefix, ":stampede:near")
}

// MarkKeyPrefix begins the marker keys of a single server (see
// [Tracker.Write]): a shape the cache refuses as a key, under the prefix
// so that tracking reports it.
func MarkKeyPrefix(prefix string) string { return slot.Companion(prefix, ":stampede:mark:") }

// markChannel carries the writers' markers to every holder of a prefix;
// ackChannel carries a holder's acknowledgements to one writer. Both are
// under the prefix, so that an ACL channel pattern granting the prefix
// grants them.
func markChannel(prefix string) string { return prefix + "stampede:near:mark" }

func ackChannel(prefix, id string) string {
	return prefix + "stampede:near:ack:" + id
}
