// This file fuzzes the record decoder: any bytes found at a key
// (another program's data, a truncated write, a newer format) must decode to
// a valid record or ErrBad, never panic; valid records round-trip through
// Encode, and optional metadata is skipped exactly.

package record

import (
	"bytes"
	"errors"
	"testing"
)

func FuzzDecodeRecord(f *testing.F) {
	for _, seed := range [][]byte{
		nil,
		{V1},
		{V1, 0},
		{V1, 0, 0},
		{V1, FlagNotFound, 0},
		{V1, FlagNotFound, 0, '"'},
		{V1, 0, 0, '"', 'v', '"'},
		{V1, 0x02, 0, '{', '}'},
		{V1, 0x80, 2, 'm', 'd', '{', '}'},
		{V1, 0x10, 9, '{', '}'},
		{V1, FlagStamped, 0, 7, 2, 1, 'a', 2, 'b', 'c', '{', '}'},
		{V1, FlagStamped | FlagNotFound, 0, 0, 0},
		{V1, FlagStamped, 0, 7, 9, 1, 'a'},
		{V1, 0x90, 20, 0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x03, 0xe8, '{', '}'},
		{V1, 0x90, 20, 0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'},
		{2, 0, 0, '"', 'v', '"'},
		[]byte("plain value from another program"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		flags, payload, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBad) {
				t.Fatalf("Decode(%q) error %v; want ErrBad", b, err)
			}
			if flags != 0 || payload != nil {
				t.Fatalf("Decode(%q) = %d, %q with an error; want zero values", b, flags, payload)
			}
			return
		}
		if flags&^knownFlags != 0 {
			t.Fatalf("Decode(%q) accepted unknown flags %#x", b, flags)
		}
		if flags&FlagNotFound != 0 && len(payload) != 0 {
			t.Fatalf("Decode(%q): not-found record with a payload", b)
		}
		// A stamp round-trips through Build.
		if st, ok := ReadStamp(b); ok {
			re := Build(flags&^FlagStamped, Freshness{}, &st, payload)
			f2, p2, err := Decode(re)
			st2, _ := ReadStamp(re)
			if err != nil || f2 != flags || !bytes.Equal(p2, payload) || st2.Clock != st.Clock || len(st2.Tags) != len(st.Tags) {
				t.Fatalf("Build(Decode(%q)) = %q: %d, %q, %v", b, re, f2, p2, err)
			}
			if !bytes.HasSuffix(b, payload) {
				t.Fatalf("Decode(%q): payload %q is not the tail", b, payload)
			}
			return
		}
		// Without optional flags and metadata, what the decoder accepts is
		// exactly what the encoder writes; with them, the payload is the tail.
		if b[1]&^requiredFlags == 0 && b[2] == 0 {
			if re := Encode(flags, payload); !bytes.Equal(re, b) {
				t.Fatalf("Encode(Decode(%q)) = %q", b, re)
			}
		} else if !bytes.HasSuffix(b, payload) || len(b) != HeaderLen+int(b[2])+len(payload) {
			t.Fatalf("Decode(%q): payload %q is not what follows the metadata", b, payload)
		}
		// Metadata of an accepted record reads without a panic, and a TTL
		// read is one a Duration holds.
		if fr, ok := ReadFreshness(b); ok && fr.TTL < 0 {
			t.Fatalf("ReadFreshness(%q).TTL = %v", b, fr.TTL)
		}
		// And the encoder's output always decodes to its input.
		f2, p2, err := Decode(Encode(flags, payload))
		if err != nil || f2 != flags || !bytes.Equal(p2, payload) {
			t.Fatalf("round trip of %d, %q = %d, %q, %v", flags, payload, f2, p2, err)
		}
	})
}
