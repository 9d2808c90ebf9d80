package record

import "encoding/binary"

// VersionBytes is v as a record stores it: big-endian with the sign bit
// flipped, so that byte-wise comparison (the write script's) orders
// versions as int64 does.
func VersionBytes(v int64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, VersionLen), uint64(v)^1<<63)
}

// AddVersion returns a copy of rec, a record [Decode] accepts, carrying the
// source's version v in its metadata (replacing the version it had).
// Readers that do not know the extension read rec as before.
func AddVersion(rec []byte, v int64) []byte {
	if at := versionAt(rec); at >= 0 {
		out := append([]byte(nil), rec...)
		copy(out[at:], VersionBytes(v))
		return out
	}
	end := HeaderLen + int(rec[2])
	out := make([]byte, 0, len(rec)+2+VersionLen)
	out = append(out, rec[:end]...)
	out = append(out, extVersion, VersionLen)
	out = append(out, VersionBytes(v)...)
	out = append(out, rec[end:]...)
	out[2] += 2 + VersionLen
	return out
}

// ReadVersion returns the source's version of a record that [Decode]
// accepted; ok is false when it has none.
func ReadVersion(b []byte) (v int64, ok bool) {
	at := versionAt(b)
	if at < 0 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b[at:]) ^ 1<<63), true
}

// versionAt is the offset of the version's bytes in record b, or -1.
func versionAt(b []byte) int {
	if len(b) < HeaderLen {
		return -1
	}
	end := HeaderLen + int(b[2])
	if end > len(b) {
		return -1
	}
	i := HeaderLen + fixedLen(b[1])
	for i+2 <= end {
		typ, n := b[i], int(b[i+1])
		if i+2+n > end {
			return -1
		}
		if typ == extVersion && n == VersionLen {
			return i + 2
		}
		i += 2 + n
	}
	return -1
}

// fixedLen is the length of the metadata that flags announce, before the
// extensions.
func fixedLen(flags byte) int {
	if flags&FlagFreshness == 0 {
		return 0
	}
	if flags&FlagTTL != 0 {
		return FreshnessLen + TTLLen
	}
	return FreshnessLen
}
