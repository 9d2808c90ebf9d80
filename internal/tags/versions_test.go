// This file checks the versions kept in memory: read under a coherence ticket, and never kept across their invalidation.

package tags

import (
	"context"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Versions read while the tracker serves are kept in memory, unless a
// version was invalidated while they were read: checked after they are
// stored, so that a DeleteByTag whose invalidation lands between the read
// and the store cannot leave the old version in memory.
func TestVersionsReadAcrossTheirInvalidationAreNotKept(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	p := redistest.Prefix(t, rdb)
	ctx := t.Context()
	s := New(rdb, p, true)
	tr := coherence.New(redistest.Client(t, redistest.Addr(t)), p, 3*time.Second, coherence.Hooks{
		OnDrop: func(_ string, all bool) {
			if all {
				s.Forget()
			}
		},
		Global: s.Global,
	})
	defer tr.Close()
	s.Track(tr)
	require.True(t, eventuallyServing(tr), "never serving")

	vs, err := s.Read(ctx, []string{s.All})
	require.NoError(t, err)
	kept, ok := s.recall([]string{s.All})
	require.True(t, ok, "versions read while serving were not kept")
	assert.Equal(t, vs, kept)

	s.Forget()
	mget := s.mget
	s.mget = func(ctx context.Context, keys []string) ([]any, error) {
		got, err := mget(ctx, keys)
		tr.Invalidate(s.All) // a Clear's invalidation, after the read's reply
		return got, err
	}
	_, err = s.Read(ctx, []string{s.All})
	require.NoError(t, err)
	_, ok = s.recall([]string{s.All})
	assert.False(t, ok, "versions read across their invalidation were kept")
}

// eventuallyServing polls tr.Serving for up to 5s (a loaded -race run is
// slow).
func eventuallyServing(tr *coherence.Tracker) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if tr.Serving() {
			return true
		}
	}
	return tr.Serving()
}
