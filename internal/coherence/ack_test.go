// This file tests how a holder counts writers' markers before it acknowledges.

package coherence

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A marker counts once per connection: published twice (a script retried
// after a lost reply) and heard twice on one master's connection, it does
// not stand for the other master's, whose invalidation may still be on its
// way. Markers that never come on every connection are forgotten after two
// leases.
func TestMarkerCountsConnectionsNotCopies(t *testing.T) {
	tr := &Tracker{id: "me", lease: time.Second, marks: map[string]*markSeen{}, acks: make(chan string, 8)}
	tr.nnodes.Store(2)
	a, b := &node{}, &node{}
	tr.marked(a, "writer:1")
	tr.marked(a, "writer:1")
	assert.Empty(t, tr.acks, "acknowledged after one connection's copies")
	tr.marked(b, "writer:1")
	require.Len(t, tr.acks, 1)
	assert.Equal(t, "writer:1", <-tr.acks)

	tr.marked(a, "writer:2")
	tr.forgetMarks()
	assert.Len(t, tr.marks, 1, "a marker forgotten within two leases")
	tr.marks["writer:2"].at -= int64(3 * time.Second)
	tr.forgetMarks()
	assert.Empty(t, tr.marks)
}

// A holder does not acknowledge its own writes (they dropped its copies
// before asking), and emptying memory acknowledges every marker still
// waiting for other connections.
func TestOwnMarkersIgnoredAndDropsAcknowledge(t *testing.T) {
	tr := &Tracker{id: "me", lease: time.Second, marks: map[string]*markSeen{}, acks: make(chan string, 8),
		hooks: Hooks{OnDrop: func(string, bool) {}}}
	tr.nnodes.Store(2)
	tr.marked(&node{}, "me:1")
	tr.marked(&node{}, "me:1")
	assert.Empty(t, tr.marks, "its own marker was counted")
	assert.Empty(t, tr.acks, "its own write was acknowledged")

	tr.marked(&node{}, "writer:7")
	require.Empty(t, tr.acks)
	tr.dropAll(false)
	require.Len(t, tr.acks, 1)
	assert.Equal(t, "writer:7", <-tr.acks)
	assert.Empty(t, tr.marks)
}

// Markers acknowledged together make one message per writer, listing its
// writes; the writer takes each of them from it, and only those it waits
// for.
func TestOneAcknowledgementPerWriter(t *testing.T) {
	assert.Equal(t, map[string]string{"w1": "1,3,4", "w2": "9"}, ackMessages([]string{"w1:1", "w2:9", "w1:3", "w1:4"}))

	w := &Tracker{pending: map[string]*confirmation{}}
	cf := func() *confirmation { return &confirmation{acked: map[string]bool{}, ch: make(chan struct{}, 1)} }
	one, three := cf(), cf()
	w.pending["1"], w.pending["3"] = one, three
	w.acked("holder:1,2,3")
	assert.True(t, one.acked["holder"])
	assert.True(t, three.acked["holder"])
	assert.Len(t, one.ch, 1, "write 1 not woken")
	assert.Len(t, three.ch, 1, "write 3 not woken")
	w.acked("bad")
	w.acked("other:3")
	assert.Equal(t, map[string]bool{"holder": true, "other": true}, three.acked)
}
