// This file kills Redis with SIGKILL in the middle of a stampede and
// starts it again (empty: the test server has no persistence), as a crash of
// a cache-only Redis does.
package reliability_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestRedisRestartMidStampede(t *testing.T) {
	t.Parallel()
	for _, policy := range []cache.FailurePolicy{cache.FailOpen, cache.FailClosed} {
		pname := map[cache.FailurePolicy]string{cache.FailOpen: "FailOpen", cache.FailClosed: "FailClosed"}[policy]
		t.Run(pname, func(t *testing.T) {
			srv := redistest.NewServer(t)
			direct := newClient(t, srv.Addr, nil)
			key := "restart:" + pname
			src := newSource(600 * time.Millisecond)
			src.entered = make(chan string, 1)
			const nprocs, callers = 3, 20
			cs := procs(t, nprocs, srv.Addr, fastFail, cache.WithFailurePolicy(policy),
				cache.WithLockTTL(2*time.Second), cache.WithRetry(100, 50*time.Millisecond),
				cache.WithLoadTimeout(10*time.Second))

			done := make(chan *outcome)
			go func() { done <- stampede(t, cs, callers, key, "v", src.loader(key, "v")) }()
			<-src.entered // a holder is loading: the lock exists only in Redis's memory
			killed := time.Now()
			srv.Kill()
			time.Sleep(300 * time.Millisecond)
			if err := srv.Start(); err != nil {
				t.Fatalf("restart redis: %v", err)
			}
			restarted := time.Now()
			var (
				out   *outcome
				ended time.Duration
			)
			select {
			case out = <-done:
				ended = time.Since(restarted)
			case <-time.After(20 * time.Second):
				t.Fatal("stampede still running 20s after the restart: a call hangs")
			}
			during := src.loads(key)

			// Every caller got the value or a clear error, never a hang or panic.
			for msg := range out.errs {
				if !strings.HasPrefix(msg, "cache: redis:") && !strings.HasPrefix(msg, cache.ErrLockNotAcquired.Error()) {
					t.Errorf("unexpected error %q", msg)
				}
			}
			if policy == cache.FailOpen && out.ok != nprocs*callers {
				t.Errorf("callers: %v; want all ok under FailOpen", out)
			}
			// The restart loses the lock: each process may load once, no more.
			if during < 1 || during > nprocs {
				t.Errorf("loads during the stampede = %d; want 1..%d", during, nprocs)
			}
			// After the restart the cache fills again and then serves hits.
			rec := eventually(t, 10*time.Second, "value cached again", func() bool {
				_, err := cs[0].GetOrLoad(context.Background(), key, src.loader(key, "v"))
				return err == nil && stored(t, direct, key) == `"v"`
			})
			before := src.loads(key)
			for _, c := range cs {
				if v, err := c.GetOrLoad(context.Background(), key, src.loader(key, "v")); err != nil || v != "v" {
					t.Errorf("after recovery: GetOrLoad = %q, %v", v, err)
				}
			}
			if n := src.loads(key) - before; n != 0 {
				t.Errorf("loads after recovery = %d; want 0 (hits)", n)
			}
			t.Logf("figures: SIGKILL+restart (down %v) mid-stampede, %s, 3 procs x 20 callers: loads during=%d, total=%d, %v, last caller returned %v after restart, value cached %v after that",
				restarted.Sub(killed).Round(time.Millisecond), pname, during, src.loads(key), out,
				ended.Round(time.Millisecond), rec.Round(time.Millisecond))
		})
	}
}

// errBoom is what failing loaders return or panic with.
var errBoom = errors.New("source exploded")
