// The versioned Set: a write that carries the source's version of the value,
// and is refused, in the write's script, when the value stored is newer.

package cache

import "errors"

// ErrOlderVersion is returned by a [Cache.Set] given a [Version] older
// than the version of the value stored at the key: a writer that updated
// the source before another one and called Set after it. Nothing was
// written, and the newer value stays; the caller has nothing to do (the
// Set still returns only once every near cache acknowledged the writes
// before it, so the newer value is what any process reads).
var ErrOlderVersion = errors.New("cache: a newer version of the value is stored")

// Version makes [Cache.Set] a versioned write: v is the source's version of
// the value (a row version, or an updated-at as time.UnixMicro), stored
// with it. The write is refused with [ErrOlderVersion] when the value at
// the key carries a version above v, atomically in the write's script, so
// that of two writers that updated the source and then call Set in either
// order, the newer value stays. An equal version is written (a retried
// Set, or the same value again), so versions must grow with every change.
//
// The version is compared with the value stored, if any: a key that is
// absent (deleted, expired, evicted) or holds a value stored without a
// version (a plain Set, a load or refresh whose loader did not call
// [SetVersion]) accepts any version. A plain Set always writes.
// [Cache.Expire] keeps the version.
// A Set with a TTL at or below zero deletes, whatever the version (the
// next read loads the source). GetOrLoad, GetOrLoadMany and Get ignore it.
// Versions are meaningful per key; the Cache does not compare across keys.
func Version(v int64) CallOption {
	return func(o *callOptions) { o.store.version, o.store.versioned = v, true }
}
