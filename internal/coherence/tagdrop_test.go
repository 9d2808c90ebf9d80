package coherence

import (
	"slices"
	"testing"
	"time"
)

// The invalidation of a Global key (a tag's version) voids every read in
// flight, calls Forget, voids them again, then drops what depends on the
// key: a read that took its ticket before Forget ran, and so may have used
// the version memory held, can keep nothing; a read after it can.
func TestGlobalKeyVoidsReadsAroundForget(t *testing.T) {
	var tr *Tracker
	var calls []string
	var during Ticket
	tr, _ = newTracker(nil, "p:", time.Second, Hooks{
		Global: func(key string) bool { return key == "p:version" },
		Forget: func(key string) {
			calls = append(calls, "forget "+key)
			during = tr.Ticket("p:value")
		},
		OnDrop: func(key string, all bool) {
			if all {
				calls = append(calls, "drop all "+key)
			}
		},
	})
	tr.ready.Store(true)
	before := tr.Ticket("p:value")
	tr.Invalidate("p:version")
	after := tr.Ticket("p:value")
	if want := []string{"forget p:version", "drop all p:version"}; !slices.Equal(calls, want) {
		t.Fatalf("hooks called %q; want %q", calls, want)
	}
	if tr.Valid(before) {
		t.Error("a read begun before the invalidation may keep its value")
	}
	if tr.Valid(during) {
		t.Error("a read begun while the version was forgotten may keep its value")
	}
	if !tr.Valid(after) {
		t.Error("a read begun after the invalidation cannot keep its value")
	}
}
