// codec_test.go checks the record format and the JSON codec.

package cache

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   byte
		payload []byte
	}{
		{"value", 0, []byte(`{"id":"p1"}`)},
		{"empty value", 0, nil},
		{"not found", flagNotFound, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags, payload, err := decodeRecord(encodeRecord(tc.flags, tc.payload))
			require.NoError(t, err)
			assert.Equal(t, tc.flags, flags)
			assert.Equal(t, len(tc.payload), len(payload))
			assert.Equal(t, string(tc.payload), string(payload))
		})
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"one byte", []byte{recordV1}},
		{"two bytes", []byte{recordV1, 0}},
		{"other version", []byte{2, 0, 0, '1'}},
		{"version zero", []byte{0, 0, 0}},
		{"unknown required flag", []byte{recordV1, 0x02, 0}},
		{"metadata past the end", []byte{recordV1, 0x10, 4, 'a', 'b'}},
		{"not found with payload", []byte{recordV1, flagNotFound, 0, 'x'}},
		{"plain JSON", []byte(`{"id":"p1"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := decodeRecord(tc.b); err == nil {
				t.Errorf("decodeRecord(%q) succeeded; want an error", tc.b)
			}
		})
	}
}

func TestDecodeRecordSkipsOptionalMetadata(t *testing.T) {
	// A newer writer's optional flag and its metadata: this version reads the
	// value and ignores the rest, so a rolling deploy does not reload keys.
	b := []byte{recordV1, 0x10 | flagNotFound, 2, 'm', 'd'}
	flags, payload, err := decodeRecord(b)
	require.NoError(t, err)
	assert.Equal(t, flagNotFound, flags)
	assert.Empty(t, payload)

	b = append([]byte{recordV1, 0x20, 3, 1, 2, 3}, `{"id":"p1"}`...)
	flags, payload, err = decodeRecord(b)
	require.NoError(t, err)
	assert.Zero(t, flags)
	assert.Equal(t, `{"id":"p1"}`, string(payload))
}

func TestJSONCodec(t *testing.T) {
	b, err := JSON.Marshal(product{ID: "p1", Price: 3})
	require.NoError(t, err)
	var p product
	require.NoError(t, JSON.Unmarshal(b, &p))
	assert.Equal(t, product{ID: "p1", Price: 3}, p)
	_, err = JSON.Marshal(make(chan int))
	assert.Error(t, err)
}
