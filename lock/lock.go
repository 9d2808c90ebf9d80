// This file is the Lock and its lease on one Redis: Obtain, Release, Refresh,
// TTL and Validity (the package doc lists the jobs it is for).

package lock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/rediserr"
	"github.com/stampede-go/stampede/internal/token"
)

var (
	//go:embed scripts/obtain.lua
	lockObtainLua    string
	lockObtainScript = redis.NewScript(lockObtainLua)

	//go:embed scripts/release.lua
	lockReleaseLua    string
	lockReleaseScript = redis.NewScript(lockReleaseLua)

	//go:embed scripts/refresh.lua
	lockRefreshLua    string
	lockRefreshScript = redis.NewScript(lockRefreshLua)

	//go:embed scripts/pttl.lua
	lockPTTLLua    string
	lockPTTLScript = redis.NewScript(lockPTTLLua)
)

// Lock is a lease on a Redis key, identified by a random token so that only
// its holder can release or extend it. Get one from [Obtain] (one Redis) or
// [ObtainQuorum] (Redlock over several independent masters). It is safe for
// concurrent use. Every method may be called on a nil *Lock, which holds
// nothing: Release, Refresh, TTL and Hold return [ErrNotHeld], the others
// return zero values. So this is safe:
//
//	lock, err := lock.Obtain(ctx, rdb, key, ttl)
//	defer lock.Release(ctx)
//
// A Lock is a lease, not a mutex: if the holder stalls past the TTL (a long
// GC pause, a frozen VM, a network partition) without refreshing, another
// process may take it while the first still believes it holds it. [Lock.Hold]
// narrows that window by cancelling the work's context when the lease can no
// longer be assumed valid, but no lease can close it. A lock from [Obtain]
// therefore carries a fencing token, [Lock.Fence]: a number that grows with
// every acquisition of the key, so that the store the holder writes to can
// refuse the writes of a holder whose lease was taken over (see Fence for
// how). A quorum lock from [ObtainQuorum] has none (Fence is 0; its doc says
// why): fence its writes in the store by other means (a version, a
// compare-and-set) or accept a rare double run. On a replicated Redis, a
// failover can lose a lock, and the last fences, that were not yet copied to
// the replica.
type Lock struct {
	masters  []redis.Scripter // one for Obtain; the independent masters for ObtainQuorum
	quorum   int              // masters that must agree: 1, or len(masters)/2+1
	redlock  bool             // from ObtainQuorum: every call is a round over the masters
	wait     time.Duration    // how long a quorum round waits for answers
	key      string
	value    string // token then metadata: what the key holds while the lock is ours
	tokenLen int
	fenceKey string // the fencing counter, in key's slot; "" on a quorum lock
	fence    int64  // set by Obtain before it returns the Lock, then read-only

	released    chan struct{} // closed by Release, for quorum calls still in flight
	releaseOnce sync.Once

	observer func(Event) // WithObserver's; nil: none
	lossSeen atomic.Bool // a loss was reported: no call reports another

	mu         sync.Mutex    // protects ttl and validUntil
	ttl        time.Duration // the lease last set, which Hold renews
	validUntil time.Time     // until when the lease is surely ours, by the local clock
}

// Obtain takes the lock at key (after [WithPrefix]) with a lease of ttl,
// rounded up to whole milliseconds, and returns it. The lease ends ttl after
// Obtain unless it is refreshed ([Lock.Refresh], [Lock.Hold]) or released.
//
// If someone else holds the lock, Obtain retries as [WithRetry] says
// (default: no retry) and then returns [ErrNotObtained]. When ctx ends
// first, during a wait or during a Redis call, the error is
// errors.Join(ErrNotObtained, ctx.Err()), never a bare context error.
// Other Redis errors end the call at once, wrapped as "lock: redis: ..."
// (errors.Is still matches the go-redis error); the attempt may have taken
// the lock, so Obtain then releases it in the background (unless
// [WithToken] is set, where the lock may have been ours before the call).
//
// The script that takes the lock also increments the key's fencing counter
// (see [Lock.Fence]); a counter that cannot be incremented (not an integer)
// gives a Redis error and leaves the lock untaken.
//
// An empty key gives [ErrEmptyKey]; a ttl under 1ms, a nil rdb or an invalid
// option give an error that names it. Obtain is safe for concurrent use.
func Obtain(ctx context.Context, rdb redis.Scripter, key string, ttl time.Duration, opts ...Option) (*Lock, error) {
	cfg, err := newConfig("Obtain", key, ttl, false, opts)
	if err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, errors.New("lock: Obtain: nil Redis client")
	}
	l := newLock([]redis.Scripter{rdb}, 1, cfg, key, ttl)
	l.fenceKey = fenceKey(l.key)
	if err := l.obtain(ctx, cfg.retry, l.tryOne, !cfg.tokenSet); err != nil {
		return nil, err
	}
	return l, nil
}

func newLock(masters []redis.Scripter, quorum int, cfg config, key string, ttl time.Duration) *Lock {
	return &Lock{
		masters:  masters,
		quorum:   quorum,
		wait:     cfg.quorumWait,
		key:      cfg.prefix + key,
		value:    cfg.token + cfg.metadata,
		tokenLen: len(cfg.token),
		released: make(chan struct{}),
		ttl:      ttl,
		observer: cfg.observer,
	}
}

// obtain makes the first attempt and the retries the strategy allows (see
// attempt), and reports the outcome to the observers.
func (l *Lock) obtain(ctx context.Context, retry RetryStrategy, try func(context.Context, bool) (bool, error), giveBack bool) error {
	start, attempts := time.Now(), 0
	err := l.attempt(ctx, retry, func(ctx context.Context, giveBack bool) (bool, error) {
		attempts++
		return try(ctx, giveBack)
	}, giveBack)
	l.reportObtain(start, attempts, err)
	return err
}

// attempt makes the first attempt and the retries the strategy allows. try
// reports whether the lock is now ours; an error from a single-master try
// ends the call, an error from a quorum round is kept to explain a failure.
func (l *Lock) attempt(ctx context.Context, retry RetryStrategy, try func(context.Context, bool) (bool, error), giveBack bool) error {
	if ctx.Err() != nil {
		return notObtained(ctx, l.key, nil)
	}
	ok, err := try(ctx, giveBack)
	for d := range retry.Backoffs() {
		if ok || (err != nil && !l.redlock) {
			break
		}
		if d < 0 {
			return fmt.Errorf("lock: retry strategy returned a negative wait (%v)", d)
		}
		if !clock.Sleep(ctx, d) {
			return notObtained(ctx, l.key, err)
		}
		ok, err = try(ctx, giveBack)
	}
	switch {
	case ok:
		return nil
	case err != nil && !l.redlock:
		return err
	default:
		return notObtained(ctx, l.key, err)
	}
}

// tryOne is one attempt on a single Redis. A Redis call that failed without a
// reply may still have taken the lock: with giveBack, it is released in the
// background so that it does not block everyone for the whole lease.
func (l *Lock) tryOne(ctx context.Context, giveBack bool) (bool, error) {
	ttl := l.lease()
	start := time.Now()
	n, err := lockObtainScript.Run(ctx, l.masters[0], []string{l.key, l.fenceKey}, l.value, l.tokenLen, leaseMillis(ttl)).Int64()
	if err != nil {
		if giveBack && !rediserr.IsReply(err) {
			l.releaseLater(ctx, l.masters[0])
		}
		if clock.Ended(ctx) {
			return false, notObtained(ctx, l.key, nil)
		}
		return false, lockRedisErr(err)
	}
	if n == 0 {
		return false, nil
	}
	l.fence = n
	l.setValid(start, ttl)
	return true, nil
}

// releaseLater releases the lock on rdb from a goroutine of its own, which
// ends when that call does (at most a few seconds: the client's timeouts).
func (l *Lock) releaseLater(ctx context.Context, rdb redis.Scripter) {
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.lease(), 5*time.Second))
		defer cancel()
		_ = lockReleaseScript.Run(ctx, rdb, []string{l.key}, l.value).Err()
	}()
}

// lockRedisErr wraps an error of a Redis call the way the whole package does.
func lockRedisErr(err error) error { return fmt.Errorf("lock: redis: %w", err) }

// Key is the Redis key of the lock, prefix included; "" on a nil Lock.
func (l *Lock) Key() string {
	if l == nil {
		return ""
	}
	return l.key
}

// Token is the random value that identifies this holder; the lock key holds
// it (followed by the metadata) while the lock is ours. "" on a nil Lock.
func (l *Lock) Token() string {
	if l == nil {
		return ""
	}
	return l.value[:l.tokenLen]
}

// Metadata is what [WithMetadata] stored with the token; "" on a nil
// Lock.
func (l *Lock) Metadata() string {
	if l == nil {
		return ""
	}
	return l.value[l.tokenLen:]
}

// Validity is how long the lease is still surely ours by the local clock:
// the last successful obtain or refresh, from the moment its request was
// sent, plus its ttl, minus a margin for clock drift (1% of the ttl plus
// 2ms, as in the Redlock algorithm). It is zero once that time has passed,
// after Release, after Refresh found the lock lost, and on a nil Lock. It
// asks no Redis; [Lock.TTL] asks Redis what it has.
func (l *Lock) Validity() time.Duration {
	if l == nil {
		return 0
	}
	return max(time.Until(l.validity()), 0)
}

// Release deletes the lock if it is still ours; otherwise it returns
// [ErrNotHeld] and changes nothing. Redis errors are wrapped as
// "lock: redis: ...". On a quorum lock it deletes the key on every master
// (see [ObtainQuorum]).
func (l *Lock) Release(ctx context.Context) error {
	if l == nil {
		return ErrNotHeld
	}
	first := false
	l.releaseOnce.Do(func() { first = true; close(l.released) })
	var err error
	if l.redlock {
		err = l.releaseQuorum(ctx)
	} else {
		err = checkOwner(lockReleaseScript.Run(ctx, l.masters[0], []string{l.key}, l.value))
	}
	if err == nil || errors.Is(err, ErrNotHeld) {
		l.setValid(time.Time{}, l.lease())
	}
	if first { // a later Release finds the key gone by the first
		l.lost(EventLostAtRelease, err)
	}
	return err
}

// Refresh sets the lease to ttl from now, rounded up to whole milliseconds,
// if the lock is still ours; otherwise it returns [ErrNotHeld] and
// changes nothing. Later renewals by [Lock.Hold] use this ttl. Redis errors
// are wrapped as "lock: redis: ..."; ttl must be at least 1ms.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return ErrNotHeld
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("lock: Refresh: ttl %v: must be at least 1ms", ttl)
	}
	start := time.Now()
	var err error
	if l.redlock {
		err = l.refreshQuorum(ctx, start, ttl)
	} else {
		err = checkOwner(lockRefreshScript.Run(ctx, l.masters[0], []string{l.key}, l.value, leaseMillis(ttl)))
	}
	switch {
	case err == nil:
		l.setValid(start, ttl)
	case errors.Is(err, ErrNotHeld):
		l.setValid(time.Time{}, ttl)
		l.lost(EventLost, err)
	}
	return err
}

// TTL returns what remains of the lease according to Redis, or
// [ErrNotHeld] if the lock is no longer ours. On a quorum lock it is the
// time until fewer than a quorum of masters hold it. If someone removed the
// key's expiry (PERSIST), TTL returns -1ns. Redis errors are wrapped as
// "lock: redis: ...".
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	if l == nil {
		return 0, ErrNotHeld
	}
	var d time.Duration
	var err error
	if l.redlock {
		d, err = l.ttlQuorum(ctx)
	} else {
		d, err = pttl(lockPTTLScript.Run(ctx, l.masters[0], []string{l.key}, l.value).Int64())
	}
	l.lost(EventLost, err)
	return d, err
}

func pttl(n int64, err error) (time.Duration, error) {
	switch {
	case err != nil:
		return 0, lockRedisErr(err)
	case n == -3:
		return 0, ErrNotHeld
	case n < 0:
		return -1, nil
	}
	return time.Duration(n) * time.Millisecond, nil
}

// checkOwner turns the reply of an owner-checked script into nil or
// [ErrNotHeld], with Redis errors wrapped.
func checkOwner(cmd *redis.Cmd) error {
	owned, err := token.Owned(cmd)
	switch {
	case err != nil:
		return lockRedisErr(err)
	case !owned:
		return ErrNotHeld
	}
	return nil
}

func (l *Lock) lease() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

func (l *Lock) validity() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// setValid records a lease of ttl granted by a request sent at start; a zero
// start means the lease is gone.
func (l *Lock) setValid(start time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ttl = ttl
	if start.IsZero() {
		l.validUntil = time.Time{}
		return
	}
	l.validUntil = start.Add(ttl - clockDrift(ttl))
}
