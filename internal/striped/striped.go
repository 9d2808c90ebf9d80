// Package striped is a small fixed set of event counters, striped so that
// concurrent adds on several cores do not all go to one cache line.
package striped

import (
	"sync/atomic"
	"unsafe"
)

const (
	// Size is how many counters a Counters holds.
	Size    = 24
	stripes = 16 // a power of two
)

// Counters is Size counters. The zero value is ready; safe for concurrent use.
type Counters struct {
	stripe [stripes]struct {
		n [Size]atomic.Int64
		_ [64]byte // keeps neighbouring stripes off one cache line
	}
}

// Add adds one to counter i. The stripe is picked by the address of the
// caller's stack: goroutines have stacks of their own, so concurrent
// callers mostly add to different stripes, for the price of a shift where
// a random number would cost more than the add.
func (s *Counters) Add(i int) {
	var here byte
	s.stripe[(uintptr(unsafe.Pointer(&here))>>13)&(stripes-1)].n[i].Add(1)
}

// Sum is the count of counter i.
func (s *Counters) Sum(i int) int64 {
	var n int64
	for j := range s.stripe {
		n += s.stripe[j].n[i].Load()
	}
	return n
}
