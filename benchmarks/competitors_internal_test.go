// This file checks, on every CI run, that each adapter
// still loads a cold key once and then serves it: the benchmarks themselves
// are not run in CI, so this is what catches an adapter broken by an
// upgrade.
package benchmarks

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestCompetitors(t *testing.T) {
	addr := redistest.Addr(t)
	for _, c := range competitors {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			prefix := redistest.Prefix(t, redistest.Client(t, addr))
			in, err := c.open(addr, time.Minute)
			if errors.Is(err, rueidis.ErrNoCache) {
				t.Skipf("%s needs RESP3 client-side caching (Redis 6+): %v", c.name, err)
			}
			if err != nil {
				t.Fatalf("open %s: %v", c.name, err)
			}
			t.Cleanup(in.Close)

			key, want := prefix+"product:42", product(42)
			var loads atomic.Int64
			load := loader(42, time.Millisecond, &loads)
			if s, ok := in.(seeder); ok && c.name == "raw" {
				if err := s.seed(ctx, key, want); err != nil {
					t.Fatalf("seed: %v", err)
				}
			}
			for i, wantLoads := range []int64{1, 1} { // a cold read, then a hit
				if c.name == "raw" {
					wantLoads = 0
				}
				got, err := in.Get(ctx, key, load)
				if err != nil {
					t.Fatalf("Get #%d(%q) error = %v; want nil", i+1, key, err)
				}
				if !sameProduct(got, want) {
					t.Errorf("Get #%d(%q) = %+v; want %+v", i+1, key, got, want)
				}
				if n := loads.Load(); n != wantLoads {
					t.Errorf("after Get #%d: %d loads; want %d", i+1, n, wantLoads)
				}
			}
		})
	}
}
