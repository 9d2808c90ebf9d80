// This file checks the record format: round trips, rejected bytes,
// skipped metadata.

package record

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   byte
		payload []byte
	}{
		{"value", 0, []byte(`{"id":"p1"}`)},
		{"empty value", 0, nil},
		{"not found", FlagNotFound, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags, payload, err := Decode(Encode(tc.flags, tc.payload))
			require.NoError(t, err)
			assert.Equal(t, tc.flags, flags)
			assert.Equal(t, len(tc.payload), len(payload))
			assert.Equal(t, string(tc.payload), string(payload))
		})
	}
}

func TestFreshnessRoundTrip(t *testing.T) {
	want := Freshness{Expiry: time.UnixMilli(1_700_000_000_123), Load: 1500 * time.Microsecond}
	b := EncodeFresh(0, want, []byte(`{}`))
	flags, payload, err := Decode(b)
	require.NoError(t, err)
	assert.Zero(t, flags)
	assert.Equal(t, `{}`, string(payload))
	got, ok := ReadFreshness(b)
	require.True(t, ok, "ReadFreshness(EncodeFresh(...)) found no metadata")
	assert.True(t, got.Expiry.Equal(want.Expiry), "Expiry = %v; want %v", got.Expiry, want.Expiry)
	assert.Equal(t, want.Load, got.Load)

	_, ok = ReadFreshness(Encode(0, []byte(`{}`)))
	assert.False(t, ok, "a record without the flag has no freshness")
}

// A value's own TTL rides after its Freshness; records without it (written
// before it existed, or with the cache's TTL) read as zero, and a reader
// that skips the metadata still finds the payload.
func TestTTLRoundTrip(t *testing.T) {
	want := Freshness{Expiry: time.UnixMilli(1_700_000_000_123), Load: time.Millisecond, TTL: 90 * time.Second}
	b := EncodeFresh(FlagThrottled, want, []byte(`{}`))
	assert.Equal(t, FlagFreshness|FlagThrottled|FlagTTL, b[1])
	flags, payload, err := Decode(b)
	require.NoError(t, err)
	assert.Zero(t, flags)
	assert.Equal(t, `{}`, string(payload))
	got, ok := ReadFreshness(b)
	require.True(t, ok)
	assert.True(t, got.Expiry.Equal(want.Expiry))
	assert.Equal(t, want.Load, got.Load)
	assert.Equal(t, want.TTL, got.TTL)

	old := []byte{V1, FlagFreshness, FreshnessLen, 0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 9, '{', '}'} // as written before the TTL
	got, ok = ReadFreshness(old)
	require.True(t, ok)
	assert.Zero(t, got.TTL, "a record without FlagTTL")
	assert.Equal(t, 9*time.Microsecond, got.Load)

	short := []byte{V1, FlagFreshness | FlagTTL, FreshnessLen, 0, 0, 1, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0, 0, 0, 9, '{', '}'}
	got, ok = ReadFreshness(short)
	require.True(t, ok)
	assert.Zero(t, got.TTL, "FlagTTL without its bytes")

	b = EncodeFresh(0, Freshness{Expiry: want.Expiry, TTL: 0}, []byte(`{}`))
	assert.Zero(t, b[1]&FlagTTL, "no TTL, no flag")
	assert.Len(t, b, HeaderLen+FreshnessLen+2)
}

func TestDecodeRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"one byte", []byte{V1}},
		{"two bytes", []byte{V1, 0}},
		{"other version", []byte{2, 0, 0, '1'}},
		{"version zero", []byte{0, 0, 0}},
		{"unknown required flag", []byte{V1, 0x02, 0}},
		{"metadata past the end", []byte{V1, 0x10, 4, 'a', 'b'}},
		{"not found with payload", []byte{V1, FlagNotFound, 0, 'x'}},
		{"plain JSON", []byte(`{"id":"p1"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Decode(tc.b); err == nil {
				t.Errorf("Decode(%q) succeeded; want an error", tc.b)
			}
		})
	}
}

func TestDecodeSkipsOptionalMetadata(t *testing.T) {
	// A newer writer's optional flag and its metadata: this version reads the
	// value and ignores the rest, so a rolling deploy does not reload keys.
	b := []byte{V1, 0x10 | FlagNotFound, 2, 'm', 'd'}
	flags, payload, err := Decode(b)
	require.NoError(t, err)
	assert.Equal(t, FlagNotFound, flags)
	assert.Empty(t, payload)

	b = append([]byte{V1, 0x20, 3, 1, 2, 3}, `{"id":"p1"}`...)
	flags, payload, err = Decode(b)
	require.NoError(t, err)
	assert.Zero(t, flags)
	assert.Equal(t, `{"id":"p1"}`, string(payload))
}

func TestStampRoundTrip(t *testing.T) {
	f := Freshness{Expiry: time.UnixMilli(1_700_000_000_123), Load: time.Millisecond}
	for _, st := range []Stamp{{Clock: 0}, {Clock: 300, Tags: []string{"tenant:42", "", "cat{7}"}}} {
		b := Build(0, f, &st, []byte(`{}`))
		flags, payload, err := Decode(b)
		require.NoError(t, err)
		assert.Equal(t, FlagStamped, flags)
		assert.Equal(t, `{}`, string(payload))
		got, ok := ReadStamp(b)
		require.True(t, ok)
		assert.Equal(t, st.Clock, got.Clock)
		assert.Equal(t, len(st.Tags), len(got.Tags))
		for i := range st.Tags {
			assert.Equal(t, st.Tags[i], got.Tags[i])
		}
		fr, ok := ReadFreshness(b)
		require.True(t, ok)
		assert.Equal(t, f.Expiry.UnixMilli(), fr.Expiry.UnixMilli())
	}
	nf := Build(FlagNotFound, Freshness{}, &Stamp{Clock: 9}, nil)
	flags, _, err := Decode(nf)
	require.NoError(t, err)
	assert.Equal(t, FlagNotFound|FlagStamped, flags)
	_, _, err = Decode(nf[:len(nf)-1]) // a cut stamp is not a record
	assert.ErrorIs(t, err, ErrBad)
	_, ok := ReadStamp(Encode(0, nil))
	assert.False(t, ok)
}
