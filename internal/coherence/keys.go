// This file names the protocol's keys and channels, which older versions read too.

package coherence

import (
	"strings"

	"github.com/stampede-go/stampede/internal/slot"
)

// invalidateChannel is where Redis sends RESP2 tracking invalidations.
const invalidateChannel = "__redis__:invalidate"

// RegistryKey is the lease registry of the near caches of prefix: a hash
// of holder id to lease end, in the server's milliseconds, and "~since" to
// when the registry was created. Its name does not begin with the prefix:
// every renewal writes it, and under the prefix Redis would report each of
// those writes to every tracking connection of the prefix, N² messages a
// second for N processes. It is "{T}:stampede:near:"+prefix (ACL pattern
// ~{*}:stampede:near:<prefix>), in the slot and Ring shard of the marker
// keys and of [LegacyRegistryKey].
func RegistryKey(prefix string) string { return slot.Front(prefix, registrySuffix) }

const registrySuffix = ":stampede:near:"

// LegacyRegistryKey is the registry of versions before 0.4, under the
// prefix, which processes of those versions read and renew alone. A
// tracker reads it too, holds a lease in it while it exists (so that a
// rolling upgrade keeps the promise both ways), and uses it alone when an
// ACL refuses [RegistryKey]. Its shape is one no value key may take.
func LegacyRegistryKey(prefix string) string { return slot.Companion(prefix, ":stampede:near") }

// IsRegistry reports whether key is the [RegistryKey] of some prefix, a
// name no value key may take.
func IsRegistry(key string) bool { return isFront(key, registrySuffix, RegistryKey) }

// isFront reports whether key is name(p) for some prefix p, where name
// puts a hash tag and suffix before p (slot.Front).
func isFront(key, suffix string, name func(string) string) bool {
	if !strings.HasPrefix(key, "{") {
		return false
	}
	j := strings.IndexByte(key, '}')
	rest, ok := strings.CutPrefix(key[j+1:], suffix)
	return ok && name(rest) == key
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

// HoldRegistryKey is the lease registry of the strict per-key near caches
// of prefix ([Hub.NewHolder]), shaped as [RegistryKey] (ACL pattern
// ~{*}:stampede:hold:<prefix>) and in its slot: a per-key holder's lease
// there is waited for only by the writes of the keys it holds, while
// [RegistryKey] lists the holders every write waits for.
func HoldRegistryKey(prefix string) string { return slot.Front(prefix, holdSuffix) }

const holdSuffix = ":stampede:hold:"

// IsHoldRegistry reports whether key is the [HoldRegistryKey] of some
// prefix, a name no value key may take.
func IsHoldRegistry(key string) bool { return isFront(key, holdSuffix, HoldRegistryKey) }

// HoldersKey is the set of the processes that hold key in memory: a hash
// of holder id to "1", in key's slot and under key itself (so under the
// prefix and its ACL pattern; but for a key with a '{' that opens no hash
// tag, "{T}:stampede:holders"+key+"}", as its lock), of a shape no value
// key may take. A strict
// per-key holder writes it before each read of key it may keep, and a
// write of key reads it after the write.
func HoldersKey(key string) string { return slot.Companion(key, holdersSuffix) }

const holdersSuffix = ":stampede:holders"

// IsHolders reports whether key is the [HoldersKey] of some key.
func IsHolders(key string) bool {
	_, ok := slot.CompanionOf(key, holdersSuffix)
	return ok
}

// holdChannel carries writers' markers to one per-key holder: a write
// announces itself only to the holders of its keys. Under the prefix, as
// the other channels.
func holdChannel(prefix, id string) string { return prefix + "stampede:near:hold:" + id }
