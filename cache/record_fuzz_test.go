// record_fuzz_test.go fuzzes the record decoder: any bytes found at a key
// (another program's data, a truncated write, a newer format) must decode to
// a valid record or errBadRecord, never panic, and valid records must
// round-trip through encodeRecord unchanged.

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
		{recordV1, flagNotFound},
		{recordV1, flagNotFound, '"'},
		{recordV1, 0, '"', 'v', '"'},
		{recordV1, 0x80, '{', '}'},
		{2, 0, '"', 'v', '"'},
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
		// What the decoder accepts is exactly what the encoder writes.
		if re := encodeRecord(flags, payload); !bytes.Equal(re, b) {
			t.Fatalf("encodeRecord(decodeRecord(%q)) = %q", b, re)
		}
		// And the encoder's output always decodes to its input.
		f2, p2, err := decodeRecord(encodeRecord(flags, payload))
		if err != nil || f2 != flags || !bytes.Equal(p2, payload) {
			t.Fatalf("round trip of %d, %q = %d, %q, %v", flags, payload, f2, p2, err)
		}
	})
}
