// This file proves that an unreachable Redis costs a handful of dial
// attempts, not one per call, and that the breaker closes again.

package cache

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dialCounter is a Redis client whose dials are counted, pointed at addr,
// that dials once per attempt (see dialOnce).
func dialCounter(t *testing.T, addr string) (*redis.Client, *atomic.Int64) {
	var dials atomic.Int64
	rdb := redis.NewClient(dialOnce(&redis.Options{
		Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}))
	t.Cleanup(func() { rdb.Close() })
	return rdb, &dials
}

func TestBreakerSkipsAnUnreachableRedis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		opts      []Option
		breaker   bool
		policy    FailurePolicy
		wantError error
	}{
		{"default, fail open", nil, true, FailOpen, nil},
		{"default, fail closed", nil, true, FailClosed, ErrCircuitOpen},
		{"off", []Option{WithoutCircuitBreaker()}, false, FailOpen, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb, _ := dialCounter(t, deadAddr(t))
			cmds := redistest.CountCommands(rdb)
			start := time.Now()
			var events [EventBreakerClose + 1]atomic.Int64
			opts := append([]Option{WithFailurePolicy(tc.policy), WithObserver(func(e Event) { events[e.Kind].Add(1) })}, tc.opts...)
			c := New[product](rdb, opts...)
			src := &counter{}
			var errs int
			for i := range 200 {
				_, err := c.GetOrLoad(t.Context(), "k"+string(rune('a'+i%26)), src.load)
				if err != nil {
					errs++
					if tc.wantError != nil && i >= 10 {
						require.ErrorIs(t, err, tc.wantError)
					}
				}
			}
			if tc.policy == FailOpen {
				assert.Zero(t, errs)
				assert.Equal(t, int64(200), src.calls.Load(), "fail open loads each call, uncached")
			} else {
				assert.Equal(t, 200, errs)
				assert.Zero(t, src.calls.Load())
			}
			sent := cmds.Count("get")
			if tc.breaker {
				// 5 failures open it; then one probe per 1s cool-down.
				probes := int(time.Since(start)/DefaultBreakerCoolDown) + 1
				assert.LessOrEqual(t, sent, DefaultBreakerFailures+probes, "an open breaker must keep calls off the dead Redis")
				assert.Equal(t, int64(1), events[EventBreakerOpen].Load())
			} else {
				assert.Equal(t, 200, sent, "without the breaker every call tries Redis")
			}
		})
	}
}

func TestBreakerClosesWhenRedisAnswersAgain(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	key := p + "k"
	addr := freeAddr(t)
	rdb, dials := dialCounter(t, addr)
	var closed atomic.Int64
	c := New[product](rdb, WithCircuitBreaker(2, 50*time.Millisecond), WithObserver(func(e Event) {
		if e.Kind == EventBreakerClose {
			closed.Add(1)
		}
	}))
	defer c.Close()
	src := &counter{}
	for range 20 {
		_, err := c.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
	}
	assert.True(t, c.brk.Open())
	before := dials.Load()

	// Redis comes back at the same address: a proxy to the test Redis.
	proxyTo(t, addr, redistest.Addr(t))
	waitFor(t, func() bool {
		_, err := c.GetOrLoad(t.Context(), key, src.load)
		return err == nil && !c.brk.Open()
	})
	assert.Greater(t, dials.Load(), before, "the probe must reach Redis")
	assert.Equal(t, int64(1), closed.Load())
	n := src.calls.Load()
	for range 5 {
		_, err := c.GetOrLoad(t.Context(), key, src.load)
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, src.calls.Load(), n+1, "with Redis back the value is cached again")
}

// proxyTo forwards connections accepted at addr to upstream until the test
// ends: a Redis that comes back at the address the client knows.
func proxyTo(t *testing.T, addr, upstream string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	closed := false // protected by mu
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			mu.Lock()
			if closed { // accepted as the test ended: nobody would close them
				mu.Unlock()
				down.Close()
				up.Close()
				return
			}
			conns = append(conns, down, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, down); up.Close() })
			wg.Go(func() { _, _ = io.Copy(down, up); down.Close() })
		}
	})
}

// TestSharedBreakerTellsEveryCache: two Caches on one client share a
// breaker; the observer of the first must hear every transition, whichever
// Cache's call (and whichever path: Set, Delete, GetOrLoad, FailClosed)
// moved it, once each.
func TestSharedBreakerTellsEveryCache(t *testing.T) {
	t.Parallel()
	_, p := setup(t) // its keys, once the test Redis answers at addr
	addr := freeAddr(t)
	rdb, _ := dialCounter(t, addr)
	var opened, closed atomic.Int64
	first := New[product](rdb, WithPrefix(p), WithCircuitBreaker(2, 20*time.Millisecond), WithoutNearCache(), WithObserver(func(e Event) {
		switch e.Kind {
		case EventBreakerOpen:
			opened.Add(1)
		case EventBreakerClose:
			closed.Add(1)
		}
	}))
	defer first.Close()
	second := New[product](rdb, WithPrefix(p), WithCircuitBreaker(2, 20*time.Millisecond), WithoutNearCache(), WithFailurePolicy(FailClosed))
	defer second.Close()
	src := &counter{}
	for range 10 { // only the second Cache's calls: the first must still hear
		_, _ = second.GetOrLoad(t.Context(), "k", src.load)
	}
	assert.Equal(t, int64(1), opened.Load(), "breaker_open heard by the first Cache, opened by the second's calls")
	for range 40 {
		_ = first.Set(t.Context(), "k", product{ID: "1"})
		_ = first.Delete(t.Context(), "k")
		_, _ = first.GetOrLoad(t.Context(), "k", src.load)
		_, _ = second.GetOrLoad(t.Context(), "k", src.load)
	}
	proxyTo(t, addr, redistest.Addr(t))
	waitFor(t, func() bool {
		_, err := second.GetOrLoad(t.Context(), "k", src.load)
		return err == nil
	})
	assert.GreaterOrEqual(t, opened.Load(), int64(1))
	assert.Equal(t, opened.Load(), closed.Load(), "every opening heard is followed by one closing")
}
