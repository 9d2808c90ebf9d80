// record_fuzz_test.go fuzzes the record decoder: any bytes found at a key
// (another program's data, a truncated write, a newer format) must decode to
// a valid record or errBadRecord, never panic; valid records round-trip
// through encodeRecord, and optional metadata is skipped exactly.

package cache

import (
	"bytes"
	"errors"
	"testing"
)

func FuzzDecodeRecord(f *testing.F) {
	for _, seed := range [][]byte{
		nil,
		{recordV1},
		{recordV1, 0},
		{recordV1, 0, 0},
		{recordV1, flagNotFound, 0},
		{recordV1, flagNotFound, 0, '"'},
		{recordV1, 0, 0, '"', 'v', '"'},
		{recordV1, 0x02, 0, '{', '}'},
		{recordV1, 0x80, 2, 'm', 'd', '{', '}'},
		{recordV1, 0x10, 9, '{', '}'},
		{2, 0, 0, '"', 'v', '"'},
		[]byte("plain value from another program"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		flags, payload, err := decodeRecord(b)
		if err != nil {
			if !errors.Is(err, errBadRecord) {
				t.Fatalf("decodeRecord(%q) error %v; want errBadRecord", b, err)
			}
			if flags != 0 || payload != nil {
				t.Fatalf("decodeRecord(%q) = %d, %q with an error; want zero values", b, flags, payload)
			}
			return
		}
		if flags&^knownFlags != 0 {
			t.Fatalf("decodeRecord(%q) accepted unknown flags %#x", b, flags)
		}
		if flags&flagNotFound != 0 && len(payload) != 0 {
			t.Fatalf("decodeRecord(%q): not-found record with a payload", b)
		}
		// Without optional flags and metadata, what the decoder accepts is
		// exactly what the encoder writes; with them, the payload is the tail.
		if b[1]&^requiredFlags == 0 && b[2] == 0 {
			if re := encodeRecord(flags, payload); !bytes.Equal(re, b) {
				t.Fatalf("encodeRecord(decodeRecord(%q)) = %q", b, re)
			}
		} else if !bytes.HasSuffix(b, payload) || len(b) != headerLen+int(b[2])+len(payload) {
			t.Fatalf("decodeRecord(%q): payload %q is not what follows the metadata", b, payload)
		}
		// And the encoder's output always decodes to its input.
		f2, p2, err := decodeRecord(encodeRecord(flags, payload))
		if err != nil || f2 != flags || !bytes.Equal(p2, payload) {
			t.Fatalf("round trip of %d, %q = %d, %q, %v", flags, payload, f2, p2, err)
		}
	})
}
