// This file defines how values become bytes (Codec); internal/record wraps
// those bytes in the record stored in Redis.

package cache

import "encoding/json"

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
