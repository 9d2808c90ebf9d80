// codec.go defines how values become bytes (Codec) and the record that wraps
// those bytes in Redis.

package cache

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"time"
)

// Codec encodes values for Redis. Implementations must be safe for concurrent
// use. Unmarshal is given a pointer to a fresh V.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default [Codec]: encoding/json.
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Record format, version 1:
//
//	byte 0      format version (recordV1)
//	byte 1      flags; the low four bits must be understood by a reader
//	            (bit 0: not found; later, compression), the high four may be
//	            ignored (bit 4: the metadata holds the freshness of the value)
//	byte 2      n, the length of the metadata that optional flags carry
//	bytes 3..   n bytes of metadata, skipped by readers that do not know it
//	the rest    the codec's bytes (empty for a not-found record)
//
// Freshness metadata (flag bit 4), 12 bytes, big-endian: the logical expiry
// (Unix milliseconds after which the value is no longer fresh; Redis keeps
// it longer, for stale serving and early refresh) and the duration of the
// load that produced it, in microseconds. Readers that do not know the flag
// skip it and treat the value as fresh until Redis expires it.
//
// A record with a newer version or an unknown required flag is unreadable,
// which counts as a miss: an old binary reloads and overwrites rather than
// misreads it. Optional additions keep old binaries reading the value during
// a rolling deploy.
const (
	recordV1      byte = 1
	flagNotFound  byte = 1 << 0
	requiredFlags byte = 0x0f
	knownFlags         = flagNotFound
	flagFreshness byte = 1 << 4
	headerLen          = 3
	freshnessLen       = 12
)

var errBadRecord = errors.New("cache: unreadable record")

// encodeRecord prepends a header without metadata to payload.
func encodeRecord(flags byte, payload []byte) []byte {
	b := make([]byte, headerLen+len(payload))
	b[0], b[1], b[2] = recordV1, flags, 0
	copy(b[headerLen:], payload)
	return b
}

// freshness is what a record says of its value's age.
type freshness struct {
	expiry time.Time     // end of the TTL; zero when the record does not say
	load   time.Duration // how long the load took
}

// encodeFresh is encodeRecord with freshness metadata.
func encodeFresh(flags byte, f freshness, payload []byte) []byte {
	b := make([]byte, headerLen+freshnessLen+len(payload))
	b[0], b[1], b[2] = recordV1, flags|flagFreshness, freshnessLen
	binary.BigEndian.PutUint64(b[3:], uint64(f.expiry.UnixMilli()))
	binary.BigEndian.PutUint32(b[11:], uint32(min(f.load.Microseconds(), math.MaxUint32)))
	copy(b[headerLen+freshnessLen:], payload)
	return b
}

// readFreshness returns the freshness metadata of a record that
// decodeRecord accepted; ok is false when it has none.
func readFreshness(b []byte) (f freshness, ok bool) {
	if b[1]&flagFreshness == 0 || b[2] < freshnessLen {
		return f, false
	}
	f.expiry = time.UnixMilli(int64(binary.BigEndian.Uint64(b[3:])))
	f.load = time.Duration(binary.BigEndian.Uint32(b[11:])) * time.Microsecond
	return f, true
}

// decodeRecord returns a record's required flags and its payload, which
// aliases b.
func decodeRecord(b []byte) (flags byte, payload []byte, err error) {
	if len(b) < headerLen || b[0] != recordV1 {
		return 0, nil, errBadRecord
	}
	flags = b[1] & requiredFlags
	start := headerLen + int(b[2])
	if flags&^knownFlags != 0 || len(b) < start {
		return 0, nil, errBadRecord
	}
	payload = b[start:]
	if flags&flagNotFound != 0 && len(payload) != 0 {
		return 0, nil, errBadRecord
	}
	return flags, payload, nil
}
