package record

import (
	"bytes"
	"math"
	"testing"
	"time"
)

func TestVersionRoundTrip(t *testing.T) {
	exp := time.UnixMilli(1_700_000_000_000)
	st := &Stamp{Clock: 7, Tags: []string{"a", "bc"}}
	for _, tc := range []struct {
		name string
		rec  []byte
	}{
		{"plain", Encode(0, []byte(`"v"`))},
		{"fresh", Build(0, Freshness{Expiry: exp, Load: time.Millisecond}, nil, []byte(`"v"`))},
		{"fresh with TTL and stamp", Build(0, Freshness{Expiry: exp, Load: time.Millisecond, TTL: time.Minute}, st, []byte(`"v"`))},
		{"expired, stamped", Build(FlagExpired, Freshness{Expiry: exp}, st, []byte(`"v"`))},
	} {
		for _, v := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1_700_000_000_123_456} {
			rec := AddVersion(tc.rec, v)
			got, ok := ReadVersion(rec)
			if !ok || got != v {
				t.Fatalf("%s: ReadVersion(AddVersion(rec, %d)) = %d, %v", tc.name, v, got, ok)
			}
			// What a reader without the extension reads is unchanged.
			f1, p1, err1 := Decode(tc.rec)
			f2, p2, err2 := Decode(rec)
			if err2 != nil || f1 != f2 || !bytes.Equal(p1, p2) || err1 != nil {
				t.Fatalf("%s: Decode with version = %d, %q, %v; want %d, %q", tc.name, f2, p2, err2, f1, p1)
			}
			fr1, ok1 := ReadFreshness(tc.rec)
			fr2, ok2 := ReadFreshness(rec)
			if fr1 != fr2 || ok1 != ok2 {
				t.Fatalf("%s: ReadFreshness with version = %+v, %v; want %+v, %v", tc.name, fr2, ok2, fr1, ok1)
			}
			s1, _ := ReadStamp(tc.rec)
			s2, _ := ReadStamp(rec)
			if s1.Clock != s2.Clock || len(s1.Tags) != len(s2.Tags) {
				t.Fatalf("%s: ReadStamp with version = %+v; want %+v", tc.name, s2, s1)
			}
			again := AddVersion(rec, v+1)
			if got, _ := ReadVersion(again); got != v+1 || len(again) != len(rec) {
				t.Fatalf("%s: a second AddVersion = %d (len %d); want %d replacing the first (len %d)", tc.name, got, len(again), v+1, len(rec))
			}
		}
		if _, ok := ReadVersion(tc.rec); ok {
			t.Fatalf("%s: ReadVersion of a record without one reports one", tc.name)
		}
	}
}

// The write script compares the stored bytes byte-wise: their order must be
// the numbers'.
func TestVersionBytesOrder(t *testing.T) {
	vs := []int64{math.MinInt64, -1 << 40, -2, -1, 0, 1, 2, 1 << 40, math.MaxInt64}
	for i := 1; i < len(vs); i++ {
		if bytes.Compare(VersionBytes(vs[i-1]), VersionBytes(vs[i])) >= 0 {
			t.Fatalf("VersionBytes(%d) >= VersionBytes(%d)", vs[i-1], vs[i])
		}
	}
}

// Unknown extensions are skipped, a truncated one is no version.
func TestVersionSkipsOtherExtensions(t *testing.T) {
	rec := []byte{V1, 0, 13, 9, 1, 'x', extVersion, VersionLen}
	rec = append(rec, VersionBytes(42)...)
	rec = append(rec, '"', 'v', '"')
	if v, ok := ReadVersion(rec); !ok || v != 42 {
		t.Fatalf("ReadVersion after an unknown extension = %d, %v; want 42", v, ok)
	}
	if _, p, err := Decode(rec); err != nil || string(p) != `"v"` {
		t.Fatalf("Decode = %q, %v", p, err)
	}
	short := []byte{V1, 0, 5, extVersion, VersionLen, 0, 0, 0, '"', '"'}
	if _, ok := ReadVersion(short); ok {
		t.Fatal("ReadVersion of a truncated extension reports one")
	}
}

func FuzzReadVersion(f *testing.F) {
	f.Add([]byte{V1, 0, 10, extVersion, VersionLen, 0x80, 0, 0, 0, 0, 0, 0, 1, '{', '}'})
	f.Add([]byte{V1, 0x90, 12, 0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 9, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, err := Decode(b); err != nil {
			return
		}
		v, ok := ReadVersion(b) // never panics on a record Decode accepts
		if !ok {
			return
		}
		if got, ok := ReadVersion(AddVersion(b, v)); !ok || got != v {
			t.Fatalf("ReadVersion(AddVersion(%q, %d)) = %d, %v", b, v, got, ok)
		}
	})
}
