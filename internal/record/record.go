// Package record is the byte format of what the cache stores at a key.
//
// A record is a short header, optional metadata, then the codec's bytes.
//
// # Format, version 1
//
//	byte 0      format version (V1)
//	byte 1      flags; the low four bits must be understood by a reader
//	            (bit 0: not found; bit 1: stamped; later, compression), the high four may be
//	            ignored (bit 4: the metadata holds the freshness of the value;
//	            bit 5: a stale value kept after a failed refresh, the cache's;
//	            bit 6: expired by hand; bit 7: the metadata holds the
//	            value's own TTL)
//	byte 2      n, the length of the metadata that optional flags carry
//	bytes 3..   n bytes of metadata, skipped by readers that do not know it
//	stamp       only with flag bit 1: the tag clock and the tags (below)
//	the rest    the codec's bytes (empty for a not-found record)
//
// Freshness metadata (flag bit 4), 12 bytes, big-endian: the logical expiry
// (Unix milliseconds after which the value is no longer fresh; Redis keeps
// it longer, for stale serving and early refresh) and the duration of the
// load that produced it, in microseconds. Readers that do not know the flag
// skip it and treat the value as fresh until Redis expires it.
//
// TTL metadata (flag bit 7, written only with bit 4), 8 bytes right after
// the Freshness, big-endian: the TTL in milliseconds, before jitter, that a
// call or a loader chose for the value instead of the cache's, so that a
// refresh stores the new value for as long. Readers that do not know the
// flag skip it (and refresh with their own TTL); records without it, older
// ones included, have the cache's TTL.
//
// Extensions follow the metadata the flags announce (the Freshness and
// TTL), within the n bytes: entries of a type byte, a length byte and that
// many bytes. A reader skips the types it does not know, and readers that
// know no extension skip them all with the rest of the metadata, so an
// extension needs no flag and keeps the format at version 1. Type 1 is the
// source's version of the value (a versioned Set), 8 bytes: the int64
// big-endian with its sign bit flipped, so that the bytes compare as the
// numbers do (see [VersionBytes]).
//
// A stamp (flag bit 1, required: a reader that ignored it could serve a
// value that DeleteByTag or Clear removed) is uvarints: the tag clock read
// before the value was loaded, the number of tags, then each tag's length
// and bytes.
//
// A record with a newer version or an unknown required flag is unreadable,
// which counts as a miss: an old binary reloads and overwrites rather than
// misreads it. Optional additions keep old binaries reading the value during
// a rolling deploy.
//
// The functions hold no state and are safe for concurrent use.
package record

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// The header's fields and lengths (see the package doc).
const (
	V1            byte = 1      // the format version this package writes and reads
	FlagNotFound  byte = 1 << 0 // required: the value does not exist; no payload
	FlagStamped   byte = 1 << 1 // required: a Stamp precedes the payload
	FlagFreshness byte = 1 << 4 // optional: the metadata starts with a Freshness
	// FlagThrottled (optional) marks a stale value kept after a failed
	// refresh: its expiry is the end of the throttle, before which nobody
	// retries.
	FlagThrottled byte = 1 << 5
	// FlagExpired (optional) marks a value expired by hand (Cache.Expire):
	// reloaded by its next read, and kept only as the fallback of a failed
	// load. Readers that do not know it see a stale value (its expiry is
	// when it was expired).
	FlagExpired byte = 1 << 6
	// FlagTTL (optional) says the metadata holds the value's own TTL after
	// its Freshness.
	FlagTTL      byte = 1 << 7
	HeaderLen         = 3  // bytes before the metadata
	FreshnessLen      = 12 // bytes of Freshness metadata
	TTLLen            = 8  // bytes of TTL metadata
	// VersionLen is the length of a source's version as stored (see
	// [VersionBytes]).
	VersionLen = 8
)

// extVersion is the type of the extension that holds the source's version.
const extVersion byte = 1

const (
	requiredFlags byte = 0x0f // flags a reader must understand
	knownFlags         = FlagNotFound | FlagStamped
)

// ErrBad is what [Decode] returns for bytes that are not a record this
// version can read; the cache counts them as a miss. The prefix names the
// package users see.
var ErrBad = errors.New("cache: unreadable record")

// Encode prepends a header without metadata to payload.
func Encode(flags byte, payload []byte) []byte {
	return Build(flags, Freshness{}, nil, payload)
}

// Stamp is what a record says of the tags of its value: the tag clock read
// before the value was loaded or written, and the value's tags. A value is
// current while no tag of it, nor the whole cache, was deleted at a later
// clock.
type Stamp struct {
	Clock uint64
	Tags  []string
}

// Build makes a record: Freshness metadata unless f is zero, a stamp
// unless st is nil.
func Build(flags byte, f Freshness, st *Stamp, payload []byte) []byte {
	n := HeaderLen + len(payload)
	if !f.Expiry.IsZero() {
		n += FreshnessLen + TTLLen
	}
	if st != nil {
		n += stampLen(st)
	}
	b := make([]byte, HeaderLen, n)
	b[0], b[1] = V1, flags
	if !f.Expiry.IsZero() {
		b[1] |= FlagFreshness
		b[2] = FreshnessLen
		b = binary.BigEndian.AppendUint64(b, uint64(f.Expiry.UnixMilli()))
		b = binary.BigEndian.AppendUint32(b, uint32(min(f.Load.Microseconds(), math.MaxUint32)))
		if f.TTL > 0 {
			b[1] |= FlagTTL
			b[2] += TTLLen
			b = binary.BigEndian.AppendUint64(b, uint64(max(f.TTL.Milliseconds(), 1)))
		}
	}
	if st != nil {
		b[1] |= FlagStamped
		b = binary.AppendUvarint(b, st.Clock)
		b = binary.AppendUvarint(b, uint64(len(st.Tags)))
		for _, t := range st.Tags {
			b = binary.AppendUvarint(b, uint64(len(t)))
			b = append(b, t...)
		}
	}
	return append(b, payload...)
}

func stampLen(st *Stamp) int {
	n := 2 * binary.MaxVarintLen64
	for _, t := range st.Tags {
		n += binary.MaxVarintLen64 + len(t)
	}
	return n
}

// Freshness is what a record says of its value's age.
type Freshness struct {
	Expiry time.Time     // end of the TTL; zero when the record does not say
	Load   time.Duration // how long the load took; stored in microseconds
	// TTL is the value's own TTL (before jitter), stored in milliseconds
	// with [FlagTTL]; zero: the cache's.
	TTL time.Duration
}

// EncodeFresh is [Encode] with Freshness metadata (f.Expiry must not be
// zero); it sets [FlagFreshness], and [FlagTTL] when f.TTL is positive.
func EncodeFresh(flags byte, f Freshness, payload []byte) []byte {
	return Build(flags, f, nil, payload)
}

// ReadFreshness returns the Freshness metadata of a record that [Decode]
// accepted; ok is false when it has none.
func ReadFreshness(b []byte) (f Freshness, ok bool) {
	if b[1]&FlagFreshness == 0 || b[2] < FreshnessLen {
		return f, false
	}
	f.Expiry = time.UnixMilli(int64(binary.BigEndian.Uint64(b[3:])))
	f.Load = time.Duration(binary.BigEndian.Uint32(b[11:])) * time.Microsecond
	if b[1]&FlagTTL != 0 && b[2] >= FreshnessLen+TTLLen {
		// A TTL that does not fit a Duration is not one this package wrote.
		if ms := binary.BigEndian.Uint64(b[HeaderLen+FreshnessLen:]); ms <= math.MaxInt64/uint64(time.Millisecond) {
			f.TTL = time.Duration(ms) * time.Millisecond
		}
	}
	return f, true
}

// Decode returns a record's required flags and its payload, which aliases b;
// for bytes that are not such a record, [ErrBad] and zero values.
func Decode(b []byte) (flags byte, payload []byte, err error) {
	if len(b) < HeaderLen || b[0] != V1 {
		return 0, nil, ErrBad
	}
	flags = b[1] & requiredFlags
	start := HeaderLen + int(b[2])
	if flags&^knownFlags != 0 || len(b) < start {
		return 0, nil, ErrBad
	}
	payload = b[start:]
	if flags&FlagStamped != 0 {
		n := skipStamp(payload)
		if n < 0 {
			return 0, nil, ErrBad
		}
		payload = payload[n:]
	}
	if flags&FlagNotFound != 0 && len(payload) != 0 {
		return 0, nil, ErrBad
	}
	return flags, payload, nil
}

// ReadStamp returns the stamp of a record that [Decode] accepted; ok is
// false when it has none.
func ReadStamp(b []byte) (st Stamp, ok bool) {
	if b[1]&FlagStamped == 0 {
		return st, false
	}
	p := b[HeaderLen+int(b[2]):]
	st.Clock, p, _ = uvarint(p)
	n, p, _ := uvarint(p)
	st.Tags = make([]string, 0, n)
	for range n {
		var l uint64
		l, p, _ = uvarint(p)
		st.Tags = append(st.Tags, string(p[:l]))
		p = p[l:]
	}
	return st, true
}

// skipStamp returns the length of the stamp that begins p, or -1 when p
// does not begin with one.
func skipStamp(p []byte) int {
	all := len(p)
	_, p, ok := uvarint(p)
	if !ok {
		return -1
	}
	n, p, ok := uvarint(p)
	if !ok || n > uint64(len(p)) { // each tag takes at least a byte
		return -1
	}
	for range n {
		var l uint64
		if l, p, ok = uvarint(p); !ok || l > uint64(len(p)) {
			return -1
		}
		p = p[l:]
	}
	return all - len(p)
}

// uvarint reads a uvarint off the front of p.
func uvarint(p []byte) (uint64, []byte, bool) {
	v, n := binary.Uvarint(p)
	if n <= 0 {
		return 0, p, false
	}
	return v, p[n:], true
}
