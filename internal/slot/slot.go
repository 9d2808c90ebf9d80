// Package slot computes Redis Cluster key slots and names keys that must
// share a slot with another key: the cache's load locks and channels, the
// lock's fencing counters.
package slot

import (
	"strconv"
	"strings"
	"sync"
)

// Count is the number of Redis Cluster slots.
const Count = 16384

// Of is the Redis Cluster slot of key: CRC16 of its hash tag (the text
// between the first '{' and the next '}', when not empty), else of the key.
func Of(key string) uint16 {
	if tag, ok := hashTag(key); ok {
		key = tag
	}
	return CRC16(key) % Count
}

// HasTag reports whether key has a hash tag: a '{' followed, after at
// least one byte, by a '}'. Every key that begins with such a key is in its
// slot.
func HasTag(key string) bool {
	_, ok := hashTag(key)
	return ok
}

// StrayBrace reports whether key has a '{' that opens no hash tag: such a
// key hashes whole, and names built by appending to it may not share its
// slot.
func StrayBrace(key string) bool { return !HasTag(key) && strings.Contains(key, "{") }

func hashTag(key string) (string, bool) {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end], true
		}
	}
	return "", false
}

// Tag returns a short string that hashes to slot s, so that "{"+Tag(s)+"}..."
// is a key of slot s.
func Tag(s uint16) string { return tags()[s%Count] }

// tags maps each cluster slot to a short string that hashes to it, built
// once on first use (109,758 decimal strings are hashed before every slot
// has one).
var tags = sync.OnceValue(func() []string {
	t := make([]string, Count)
	for n, left := 0, Count; left > 0; n++ {
		s := strconv.Itoa(n)
		if c := CRC16(s) % Count; t[c] == "" {
			t[c] = s
			left--
		}
	}
	return t
})

// Companion returns the name of a key that belongs to key: in key's slot,
// distinct for every key and suffix (one-to-one), and starting with key
// itself whenever key has no stray '{', so that an ACL pattern that grants
// key grants it too. suffix must be non-empty, must not end with '}' and
// must contain no '{' or '}'.
//
//   - key has a hash tag: key+"{}"+suffix (the first tag still decides the
//     slot; "{}" keeps the name apart from the next case's);
//   - key has no '{': key+"{T}"+suffix, where T hashes to key's slot;
//   - otherwise ('{' without a tag): "{T}"+suffix+key+"}".
func Companion(key, suffix string) string {
	if _, ok := hashTag(key); ok {
		return key + "{}" + suffix
	}
	t := "{" + Tag(Of(key)) + "}"
	if strings.IndexByte(key, '{') < 0 {
		return key + t + suffix
	}
	return t + suffix + key + "}"
}

// CompanionOf inverts Companion for suffix: whether key is
// Companion(owner, suffix) for some owner, and which. Names that only look
// alike (a wrong slot tag, a missing brace) are not.
func CompanionOf(key, suffix string) (owner string, ok bool) {
	// key+"{}"+suffix, key with a hash tag.
	if v, ok := strings.CutSuffix(key, "{}"+suffix); ok && HasTag(v) {
		return v, true
	}
	// key+"{T}"+suffix, key without '{': the first '{' opens T.
	if v, ok := strings.CutSuffix(key, "}"+suffix); ok {
		if i := strings.IndexByte(v, '{'); i >= 0 && v[i+1:] == Tag(Of(v[:i])) {
			return v[:i], true
		}
	}
	// "{T}"+suffix+key+"}", key with a '{' that opens no tag.
	if rest, ok := strings.CutPrefix(key, "{"); ok {
		if j := strings.IndexByte(rest, '}'); j > 0 {
			if v, ok := strings.CutPrefix(rest[j+1:], suffix); ok {
				if v, ok := strings.CutSuffix(v, "}"); ok && strings.Contains(v, "{") && !HasTag(v) &&
					rest[:j] == Tag(Of(v)) {
					return v, true
				}
			}
		}
	}
	return "", false
}

// Under returns a name that begins with prefix, for keys that belong to a
// prefix rather than to one key (the tag versions): in one slot and Ring
// shard for every suffix of one prefix, and reported by tracking and
// granted by ACL patterns of the prefix. It is Companion(prefix, suffix)
// but for a prefix with a stray '{': prefix+"{}"+suffix, whose hash tag
// runs from that '{' to the "}" and so is the same for every suffix.
// suffix must not begin with '}' and must contain no '{' or '}'; prefix
// must pass HasUnder.
func Under(prefix, suffix string) string {
	if strings.IndexByte(prefix, '{') >= 0 {
		return prefix + "{}" + suffix
	}
	return Companion(prefix, suffix)
}

// HasUnder reports whether Under's names of prefix share a slot: not when
// prefix's first '{' is closed at once ("{}"), which makes Redis hash
// every name beginning with prefix whole.
func HasUnder(prefix string) bool {
	i := strings.IndexByte(prefix, '{')
	return i < 0 || i+1 == len(prefix) || prefix[i+1] != '}'
}

// Front returns "{"+T+"}"+suffix+key: a name in key's slot that does not
// begin with key, where T is key's own hash tag when it has one (a Ring
// shards by the tag's text, so the name goes where key's companions go),
// else a tag of key's slot. suffix must contain no '{' or '}'.
func Front(key, suffix string) string {
	t, ok := hashTag(key)
	if !ok {
		t = Tag(Of(key))
	}
	return "{" + t + "}" + suffix + key
}

// CRC16 is CRC-16/XMODEM, the hash of Redis Cluster key slots.
func CRC16(s string) uint16 {
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
