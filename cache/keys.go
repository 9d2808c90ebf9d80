// keys.go names the Redis keys the cache writes besides the values: the load
// lock of each value key, one-to-one, in the value's cluster slot, and of a
// shape no value key may take.

package cache

import (
	"strconv"
	"strings"
	"sync"
)

// lockInfix follows the slot tag in every lock name: "{T}:stampede:lock:key".
const lockInfix = ":stampede:lock:"

// LockKey returns the Redis key of the load lock that [Cache.GetOrLoad] takes
// for the value stored at valueKey (the full key, prefix included), for
// operators and tests. It is "{T}:stampede:lock:" followed by valueKey, where
// T is a short string that Redis Cluster hashes to valueKey's slot: the lock
// is in the value's slot, distinct for every value key, and never equal to a
// key the cache accepts (see [ErrReservedKey]).
func LockKey(valueKey string) string {
	return "{" + slotTags()[slot(valueKey)] + "}" + lockInfix + valueKey
}

// isLockName reports whether key has the shape of a lock name, which value
// keys may not take, so that no value can be stored where a lock lives.
func isLockName(key string) bool {
	if len(key) == 0 || key[0] != '{' {
		return false
	}
	end := strings.IndexByte(key, '}')
	return end > 0 && strings.HasPrefix(key[end+1:], lockInfix)
}

const slots = 16384

// slot is the Redis Cluster slot of key: CRC16 of its hash tag (the text
// between the first '{' and the next '}', when not empty), else of the key.
func slot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return crc16(key) % slots
}

// slotTags maps each cluster slot to a short string that hashes to it, built
// once on first use (109,758 decimal strings are hashed before every slot
// has one).
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, slots)
	for n, left := 0, slots; left > 0; n++ {
		t := strconv.Itoa(n)
		if s := crc16(t) % slots; tags[s] == "" {
			tags[s] = t
			left--
		}
	}
	return tags
})

// crc16 is CRC-16/XMODEM, the hash of Redis Cluster key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
