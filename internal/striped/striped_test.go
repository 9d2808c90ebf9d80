package striped

import (
	"sync"
	"testing"
)

func TestConcurrentAddsAreCounted(t *testing.T) {
	var s Counters
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				s.Add(3)
			}
		})
	}
	wg.Wait()
	if got := s.Sum(3); got != 8000 {
		t.Errorf("Sum(3) = %d; want 8000", got)
	}
	if got := s.Sum(Size - 1); got != 0 {
		t.Errorf("Sum(%d) = %d; want 0", Size-1, got)
	}
}

// BenchmarkAdd is what counting adds to a near hit: one striped atomic
// add, from every core at once.
func BenchmarkAdd(b *testing.B) {
	var s Counters
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Add(1)
		}
	})
}
