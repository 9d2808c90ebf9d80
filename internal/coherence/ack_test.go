// ack_test.go tests how a holder counts writers' markers before it acknowledges.

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
	tr := &Tracker{id: "me", lease: time.Second, marks: map[string]*markSeen{}, acks: make(chan string, 8)}
	tr.nnodes.Store(2)
	tr.marked(&node{}, "me:1")
	tr.marked(&node{}, "me:1")
	assert.Empty(t, tr.marks, "its own marker was counted")
	assert.Empty(t, tr.acks, "its own write was acknowledged")

	tr.marked(&node{}, "writer:7")
	require.Empty(t, tr.acks)
	tr.ackAll()
	require.Len(t, tr.acks, 1)
	assert.Equal(t, "writer:7", <-tr.acks)
	assert.Empty(t, tr.marks)
}
