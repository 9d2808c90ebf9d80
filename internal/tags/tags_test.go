package tags

import (
	"os"
	"testing"

	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Finish(m.Run()))
}

// A tag with braces must not make a hash tag of its own: its version lives
// with the others, in one slot.
func TestTagKeysShareOneSlot(t *testing.T) {
	s := New(nil, "p:", true)
	want := s.Key("plain")
	for _, tag := range []string{"{x}", "a}b{", "%7B", "{"} {
		k := s.Key(tag)
		assert.True(t, s.Global(k), "%q", k)
		assert.Equal(t, slot.Of(want), slot.Of(k), "%q", k)
	}
	assert.NotEqual(t, s.Key("%7B"), s.Key("{"))
	assert.Equal(t, slot.Of(want), slot.Of(s.Clock))
	assert.Equal(t, slot.Of(want), slot.Of(s.All))
	assert.True(t, s.Global(s.Clock))
	assert.False(t, s.Global("p:value"))
}

func TestMerge(t *testing.T) {
	assert.Nil(t, Merge(nil, nil))
	assert.Equal(t, []string{"a", "b", "c"}, Merge([]string{"c", "a"}, []string{"b", "a"}))
	assert.Equal(t, []string{"x"}, Merge([]string{"x", "x"}, nil))
	assert.Len(t, New(nil, "p:", true).Keys([]string{"b", "a", "b"}), 2)
}

// A record is current until a version it depends on (its tags', or the
// Cache's) passes its clock; without WithTags nothing is stamped.
func TestCurrentAgainstVersions(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	p := redistest.Prefix(t, rdb)
	ctx := t.Context()
	s := New(rdb, p, true)

	st, err := s.Stamp(ctx, []string{"a"})
	require.NoError(t, err)
	assert.Equal(t, &record.Stamp{Clock: 0, Tags: []string{"a"}}, st)
	cur, err := s.Current(ctx, *st)
	require.NoError(t, err)
	assert.True(t, cur)

	require.NoError(t, rdb.Set(ctx, s.Clock, 5, 0).Err())
	require.NoError(t, rdb.Set(ctx, s.Key("a"), 5, 0).Err())
	cur, err = s.Current(ctx, *st)
	require.NoError(t, err)
	assert.False(t, cur, "tag a deleted at clock 5")
	assert.Equal(t, []bool{true, false}, s.Vouched(ctx, []*record.Stamp{nil, st}))

	st, err = s.Stamp(ctx, []string{"a", "b"})
	require.NoError(t, err)
	assert.Equal(t, uint64(5), st.Clock)
	current := s.CurrentAll(ctx, [][]byte{record.Build(0, record.Freshness{}, st, []byte("v")), nil})
	cur, err = current(*st)
	require.NoError(t, err)
	assert.True(t, cur, "stamped at the deleting clock: current")

	require.NoError(t, rdb.Set(ctx, s.All, "x", 0).Err())
	_, err = s.Current(ctx, *st)
	assert.ErrorContains(t, err, "not a number")

	off := New(rdb, p, false)
	st, err = off.Stamp(ctx, []string{"a"})
	assert.NoError(t, err)
	assert.Nil(t, st)
}
