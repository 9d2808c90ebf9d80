// Package msgpack is a [cache.Codec] that stores values as MessagePack
// (github.com/vmihailenco/msgpack/v5): smaller and faster to decode than the
// default JSON, and what go-redis/cache uses. Copy it into your project; it is
// not part of the cache module, so that msgpack stays out of the go.sum of
// projects that do not want it.
package msgpack

import (
	"github.com/stampede-go/stampede/cache"
	"github.com/vmihailenco/msgpack/v5"
)

// Codec encodes values with msgpack. Struct fields are named by their
// `msgpack:"name"` tags, else by their Go names. It is safe for concurrent use.
type Codec struct{}

var _ cache.Codec = Codec{}

// Marshal encodes v.
func (Codec) Marshal(v any) ([]byte, error) { return msgpack.Marshal(v) }

// Unmarshal decodes data into v, a pointer.
func (Codec) Unmarshal(data []byte, v any) error { return msgpack.Unmarshal(data, v) }
