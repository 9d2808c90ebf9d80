// This file proves ObtainQuorum against five real redis-server
// processes on loopback, with some of them killed or stopped (SIGSTOP).

package lock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// quorumSet is five independent Redis masters, each its own process.
type quorumSet struct {
	servers []*redistest.Server
	clients []*redis.Client
	masters []redis.Scripter
}

func newQuorumSet(t *testing.T) *quorumSet {
	t.Helper()
	q := &quorumSet{}
	for range 5 {
		s := redistest.PrivateServer(t, "Redlock needs five masters it can kill and freeze")
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		q.servers = append(q.servers, s)
		q.clients = append(q.clients, c)
		q.masters = append(q.masters, c)
	}
	return q
}

// stop freezes server i with SIGSTOP until the test ends (or cont).
func (q *quorumSet) stop(t *testing.T, i int) {
	t.Helper()
	p := q.servers[i].Process()
	require.NoError(t, p.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = p.Signal(syscall.SIGCONT) }) // runs before the server is stopped
}

func (q *quorumSet) cont(t *testing.T, i int) {
	t.Helper()
	require.NoError(t, q.servers[i].Process().Signal(syscall.SIGCONT))
}

// holding counts the masters whose key holds value (only live ones can).
func (q *quorumSet) holding(key, value string, live ...int) int {
	n := 0
	for _, i := range live {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if q.clients[i].Get(ctx, key).Val() == value {
			n++
		}
		cancel()
	}
	return n
}

var all5 = []int{0, 1, 2, 3, 4}

func TestRedlockAllUp(t *testing.T) {
	q := newQuorumSet(t)
	const ttl = 10 * time.Second
	l, err := ObtainQuorum(t.Context(), q.masters, "job", ttl, WithMetadata("host-a"))
	require.NoError(t, err)
	assert.Equal(t, 5, q.holding("job", l.Token()+"host-a", all5...), "the key is set on every master")
	assert.Greater(t, l.Validity(), ttl-clockDrift(ttl)-time.Second)
	assert.LessOrEqual(t, l.Validity(), ttl-clockDrift(ttl))

	_, err = ObtainQuorum(t.Context(), q.masters, "job", ttl)
	assert.ErrorIs(t, err, ErrNotObtained)

	d, err := l.TTL(t.Context())
	require.NoError(t, err)
	assert.InDelta(t, ttl, d, float64(time.Second))
	require.NoError(t, l.Refresh(t.Context(), time.Minute))
	d, err = l.TTL(t.Context())
	require.NoError(t, err)
	assert.InDelta(t, time.Minute, d, float64(time.Second))

	require.NoError(t, l.Release(t.Context()))
	assert.Zero(t, q.holding("job", l.Token()+"host-a", all5...), "Release deletes the key on every master")
	assert.ErrorIs(t, l.Release(t.Context()), ErrNotHeld)
	assert.ErrorIs(t, l.Refresh(t.Context(), time.Minute), ErrNotHeld)
}

func TestRedlockTwoKilled(t *testing.T) {
	q := newQuorumSet(t)
	q.servers[1].Kill()
	q.servers[3].Kill()
	live := []int{0, 2, 4}

	l, err := ObtainQuorum(t.Context(), q.masters, "job", 10*time.Second)
	require.NoError(t, err, "three of five is a majority")
	assert.Equal(t, 3, q.holding("job", l.Token(), live...))
	require.NoError(t, l.Refresh(t.Context(), time.Minute))
	d, err := l.TTL(t.Context())
	require.NoError(t, err)
	assert.InDelta(t, time.Minute, d, float64(time.Second))

	var cancelled atomic.Bool
	require.NoError(t, l.Hold(t.Context(), waitOrGiveUp(50*time.Millisecond, &cancelled)))
	assert.False(t, cancelled.Load())

	require.NoError(t, l.Release(t.Context()))
	assert.Zero(t, q.holding("job", l.Token(), live...))
}

// TestRedlockTwoStalled: two masters are frozen. ObtainQuorum and Release
// must not wait for them past the quorum wait, and nothing of the lock may be
// left once they wake up.
func TestRedlockTwoStalled(t *testing.T) {
	q := newQuorumSet(t)
	for _, i := range []int{0, 4} {
		// A connection made before the freeze, so that the SET reaches the
		// frozen server's socket.
		require.NoError(t, q.clients[i].Ping(t.Context()).Err())
		q.stop(t, i)
	}
	const ttl, wait = 10 * time.Second, 300 * time.Millisecond
	start := time.Now()
	l, err := ObtainQuorum(t.Context(), q.masters, "job", ttl, WithQuorumWait(wait))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), wait+time.Second, "ObtainQuorum waited for frozen masters")
	assert.Greater(t, l.Validity(), ttl-wait-clockDrift(ttl)-time.Second)
	assert.Equal(t, 3, q.holding("job", l.Token(), 1, 2, 3))

	start = time.Now()
	require.NoError(t, l.Release(t.Context()), "three of five released")
	assert.Less(t, time.Since(start), wait+time.Second, "Release waited for frozen masters")

	q.cont(t, 0)
	q.cont(t, 4)
	assert.Eventually(t, func() bool { return q.holding("job", l.Token(), all5...) == 0 }, 5*time.Second, 10*time.Millisecond,
		"nothing of the lock may be left once the frozen masters wake up")
}

// lateObtain holds back the lock's obtain calls until gate is closed and then
// runs them whatever their context says: a network that delivers the SET
// after the client stopped waiting for it.
type lateObtain struct {
	gate chan struct{}
	ran  *atomic.Int64 // obtain calls that reached Redis
}

func (h lateObtain) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lateObtain) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 1 && (args[1] == lockObtainScript.Hash() || args[1] == lockObtainLua) {
			<-h.gate
			defer h.ran.Add(1)
			return next(context.WithoutCancel(ctx), cmd)
		}
		return next(ctx, cmd)
	}
}
func (h lateObtain) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedlockLateGrantIsGivenBack: two masters grant the lock only after the
// attempt stopped waiting for them. When that is after Release, or after a
// failed attempt, the late grant must be released, not left for the lease.
func TestRedlockLateGrantIsGivenBack(t *testing.T) {
	q := newQuorumSet(t)
	late := lateObtain{gate: make(chan struct{}), ran: new(atomic.Int64)}
	q.clients[0].AddHook(late)
	q.clients[4].AddHook(late)
	gateOpen := false
	defer func() {
		if !gateOpen {
			close(late.gate)
		}
	}()

	l, err := ObtainQuorum(t.Context(), q.masters, "job", time.Minute, WithQuorumWait(200*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
	close(late.gate) // the two SETs land now, after Release
	gateOpen = true
	require.Eventually(t, func() bool { return late.ran.Load() >= 2 }, 5*time.Second, time.Millisecond, "the late SETs must run")
	assert.Eventually(t, func() bool {
		return q.clients[0].Exists(t.Context(), "job").Val()+q.clients[4].Exists(t.Context(), "job").Val() == 0
	}, 5*time.Second, 10*time.Millisecond, "a grant that lands after Release must be released")
}

func TestRedlockThreeDownFails(t *testing.T) {
	q := newQuorumSet(t)
	q.servers[0].Kill()
	q.servers[1].Kill()
	q.stop(t, 2)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	// A wait long enough for go-redis's dial retries to end with an error.
	_, err := ObtainQuorum(ctx, q.masters, "job", 10*time.Second, WithQuorumWait(2*time.Second))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "the masters' errors explain the failure")
	assert.Contains(t, err.Error(), "lock: redis: master 0: ")
	assert.ErrorIs(t, err, errNoAnswer, "the frozen master did not answer")
	assert.Eventually(t, func() bool {
		return q.clients[3].Exists(t.Context(), "job").Val()+q.clients[4].Exists(t.Context(), "job").Val() == 0
	}, 5*time.Second, 10*time.Millisecond, "a failed attempt releases the key on the masters that granted it")
}

func TestRedlockHeldElsewhere(t *testing.T) {
	q := newQuorumSet(t)
	for _, i := range []int{0, 1} {
		require.NoError(t, q.clients[i].Set(t.Context(), "two", "other", time.Minute).Err())
	}
	l, err := ObtainQuorum(t.Context(), q.masters, "two", 10*time.Second)
	require.NoError(t, err, "a minority held by someone else does not stop a majority")
	assert.Equal(t, 3, q.holding("two", l.Token(), all5...))
	require.NoError(t, l.Release(t.Context()))
	assert.Equal(t, 2, q.holding("two", "other", all5...), "Release leaves the other holder's keys")

	for _, i := range []int{0, 1, 2} {
		require.NoError(t, q.clients[i].Set(t.Context(), "three", "other", time.Minute).Err())
	}
	_, err = ObtainQuorum(t.Context(), q.masters, "three", 10*time.Second)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Eventually(t, func() bool {
		return q.clients[3].Exists(t.Context(), "three").Val()+q.clients[4].Exists(t.Context(), "three").Val() == 0
	}, 5*time.Second, 10*time.Millisecond, "the two masters it got are released")
	assert.Equal(t, 3, q.holding("three", "other", all5...))
}

// TestRedlockContextEnds covers ObtainQuorum: however ctx
// ends (during a wait or during a round), the error is ErrNotObtained
// joined with ctx.Err().
func TestRedlockContextEnds(t *testing.T) {
	q := newQuorumSet(t)
	for _, c := range q.clients {
		require.NoError(t, c.Set(t.Context(), "held", "other", time.Minute).Err())
	}
	bare := 0
	for i := range 100 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(1+i%3)*time.Millisecond)
		_, err := ObtainQuorum(ctx, q.masters, "held", time.Minute, WithRetry(LinearBackoff(time.Millisecond)))
		cancel()
		if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			if bare++; bare <= 3 {
				t.Logf("run %d: ObtainQuorum = %v", i, err)
			}
		}
	}
	assert.Zero(t, bare, "ObtainQuorum returned an error without ErrNotObtained and ctx.Err() in %d of 100 runs", bare)
	assert.Equal(t, 5, q.holding("held", "other", all5...))
}

// TestRedlockValidity: the validity is ttl - elapsed - drift, counted from
// before the first request; when the masters answer too late for any
// validity to remain, the lock is not acquired.
func TestRedlockValidity(t *testing.T) {
	assert.Equal(t, 102*time.Millisecond, clockDrift(10*time.Second))
	assert.Equal(t, 3*time.Millisecond, clockDrift(100*time.Millisecond))

	q := newQuorumSet(t)
	const delay = 100 * time.Millisecond
	for _, c := range q.clients {
		c.AddHook(redistest.Delay(redistest.IsScript, delay))
	}
	const ttl = 2 * time.Second
	l, err := ObtainQuorum(t.Context(), q.masters, "job", ttl, WithQuorumWait(time.Second))
	require.NoError(t, err)
	assert.LessOrEqual(t, l.Validity(), ttl-delay-clockDrift(ttl), "the time the masters took must come off the validity")
	assert.Greater(t, l.Validity(), time.Duration(0))
	require.NoError(t, l.Release(t.Context()))

	_, err = ObtainQuorum(t.Context(), q.masters, "late", 80*time.Millisecond, WithQuorumWait(time.Second))
	require.ErrorIs(t, err, ErrNotObtained, "answers after the validity time do not make a lock")
}

// TestRedlockLostQuorumCancelsHold: three masters die while the work runs;
// refreshes cannot reach a majority and the work is cancelled by the end of
// the validity time.
func TestRedlockLostQuorumCancelsHold(t *testing.T) {
	q := newQuorumSet(t)
	const ttl = 600 * time.Millisecond
	// A third of the TTL, not the default tenth (60 ms): the first round
	// dials five fresh clients, which a loaded machine may take longer for.
	l, err := ObtainQuorum(t.Context(), q.masters, "job", ttl, WithQuorumWait(ttl/3))
	require.NoError(t, err)
	var cancelled atomic.Bool
	err = l.Hold(t.Context(), func(ctx context.Context) error {
		for _, i := range []int{0, 2, 4} {
			q.servers[i].Kill()
		}
		return waitOrGiveUp(10*time.Second, &cancelled)(ctx)
	})
	assert.True(t, cancelled.Load(), "the work must be cancelled when the quorum is lost")
	assert.ErrorIs(t, err, ErrLost)
}

// TestRedlockMutualExclusion: workers contend with jittered retries; no two
// may hold the lock at once, and all get it in turn.
func TestRedlockMutualExclusion(t *testing.T) {
	q := newQuorumSet(t)
	const workers = 8
	var inside, overlaps, done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			l, err := ObtainQuorum(ctx, q.masters, "mutex", 5*time.Second,
				WithRetry(ExponentialBackoff(5*time.Millisecond, 50*time.Millisecond)))
			if err != nil {
				errs <- err
				return
			}
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
			inside.Add(-1)
			done.Add(1)
			if err := l.Release(context.Background()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Zero(t, overlaps.Load(), "two workers held the lock at once")
	assert.Equal(t, int64(workers), done.Load())
}

// heldRelease holds back the first release script sent through a client
// until gate is closed: the clean-up of a failed attempt that reaches a
// master late.
type heldRelease struct {
	gate chan struct{}
	held *atomic.Bool  // the first release was caught
	ran  *atomic.Int64 // releases that reached Redis
}

func (h heldRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h heldRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 1 && (args[1] == lockReleaseScript.Hash() || args[1] == lockReleaseLua) {
			if h.held.CompareAndSwap(false, true) {
				<-h.gate
			}
			defer h.ran.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h heldRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedlockStaleReleaseAfterRetry: the first attempt fails holding masters
// 0 and 1, and its release on master 0 is slow. The retry must not count
// master 0 (where the key still holds the same value, "already ours") before
// that release has run, or the release deletes the key of the lock it
// returned: it would hold two masters, not three, and a second client could
// take the lock on the other three.
func TestRedlockStaleReleaseAfterRetry(t *testing.T) {
	q := newQuorumSet(t)
	rel := heldRelease{gate: make(chan struct{}), held: new(atomic.Bool), ran: new(atomic.Int64)}
	q.clients[0].AddHook(rel)
	var openGate sync.Once
	open := func() { openGate.Do(func() { close(rel.gate) }) }
	defer open()
	for _, i := range []int{2, 3, 4} {
		require.NoError(t, q.clients[i].Set(t.Context(), "job", "other", time.Minute).Err())
	}
	retry := RetryFunc(func(n int) (time.Duration, bool) {
		switch n {
		case 1: // the other holder leaves master 2: the retry can get 0, 1 and 2
			_ = q.clients[2].Del(context.Background(), "job").Err()
		case 2: // the stale release lands
			open()
		}
		return 10 * time.Millisecond, n <= 5
	})
	l, err := ObtainQuorum(t.Context(), q.masters, "job", 10*time.Second,
		WithQuorumWait(200*time.Millisecond), WithRetry(retry))
	require.NoError(t, err)
	require.True(t, rel.held.Load(), "the failed attempt's release on master 0 must have been held back")
	open()
	require.Eventually(t, func() bool { return rel.ran.Load() >= 1 }, 5*time.Second, time.Millisecond, "the held release must run")

	assert.Equal(t, 3, q.holding("job", l.Token(), all5...), "the lock must still hold the three masters it counted")
	for _, i := range []int{3, 4} { // the other holder leaves: only a lock that lost a master can be taken again
		require.NoError(t, q.clients[i].Del(t.Context(), "job").Err())
	}
	if other, err := ObtainQuorum(t.Context(), q.masters, "job", 10*time.Second); err == nil {
		t.Error("a second client obtained the lock while the first held it")
		_ = other.Release(t.Context())
	} else {
		assert.ErrorIs(t, err, ErrNotObtained)
	}
	assert.NoError(t, l.Release(t.Context()))
}

func TestObtainQuorumBadInput(t *testing.T) {
	q := []redis.Scripter{redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t)})}
	defer q[0].(*redis.Client).Close()
	for _, tc := range []struct {
		name    string
		masters []redis.Scripter
		opts    []Option
		want    string
	}{
		{"no masters", nil, nil, "no masters"},
		{"nil master", []redis.Scripter{q[0], nil}, nil, "nil master"},
		{"bad wait", q, []Option{WithQuorumWait(0)}, "WithQuorumWait(0s)"},
		{"bad retry", q, []Option{WithRetry(LinearBackoff(-time.Second))}, "LinearBackoff(-1s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ObtainQuorum(t.Context(), tc.masters, "k", time.Second, tc.opts...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.False(t, errors.Is(err, ErrNotObtained))
		})
	}
}
