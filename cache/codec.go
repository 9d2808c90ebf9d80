// codec.go defines how values become bytes (Codec) and the record that wraps
// those bytes in Redis.

package cache

import (
	"encoding/json"
	"errors"
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
//	byte 0   format version (recordV1)
//	byte 1   flags
//	byte 2.. the codec's bytes (empty for a not-found record)
//
// Flags this version does not know (compression, load duration and logical
// expiry for early refresh) make the record unreadable to it, which counts as
// a miss: an old binary reloads and overwrites instead of misreading a newer
// record.
const (
	recordV1     byte = 1
	flagNotFound byte = 1 << 0
	knownFlags        = flagNotFound
	headerLen         = 2
)

var errBadRecord = errors.New("cache: unreadable record")

// encodeRecord prepends the header to payload.
func encodeRecord(flags byte, payload []byte) []byte {
	b := make([]byte, headerLen+len(payload))
	b[0], b[1] = recordV1, flags
	copy(b[headerLen:], payload)
	return b
}

// decodeRecord splits a record into its flags and payload. The payload
// aliases b.
func decodeRecord(b []byte) (flags byte, payload []byte, err error) {
	if len(b) < headerLen || b[0] != recordV1 || b[1]&^knownFlags != 0 {
		return 0, nil, errBadRecord
	}
	flags, payload = b[1], b[headerLen:]
	if flags&flagNotFound != 0 && len(payload) != 0 {
		return 0, nil, errBadRecord
	}
	return flags, payload, nil
}
