// This file is the Redlock algorithm: one lock over N independent Redis
// masters, held while a majority of them grant it within its validity time.

package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// ObtainQuorum takes the lock at key on a majority of masters, N independent
// Redis servers (not replicas of one another, not shards of one cluster),
// following the Redlock algorithm (https://redis.io/docs/latest/develop/use/patterns/distributed-locks/):
//
//  1. Note the time, then try SET key token NX PX ttl on all N masters at
//     once, waiting at most [WithQuorumWait] (default ttl/10) for their
//     answers, and less once a majority has refused.
//  2. The lock is ours when at least N/2+1 masters granted it and the
//     validity time, ttl - elapsed - drift, is still positive, where elapsed
//     is the time step 1 took and drift = ttl/100 + 2ms allows for clock drift
//     between the machines. [Lock.Validity] then counts it down.
//  3. Otherwise the key is released on every master, including any that
//     answers late, and the attempt has failed: it is retried as
//     [WithRetry] says (default: no retry; use a jittered strategy such
//     as [ExponentialBackoff], so that clients that split the votes do not
//     split them again). A retry asks a master only once the previous
//     attempt's request and release there have ended (until then that
//     master counts as not answering), so that a release meant for a failed
//     attempt cannot delete the key of a later one. When no attempt succeeds
//     the error is [ErrNotObtained], joined with ctx.Err() if ctx ended
//     and with the last attempt's Redis errors, each wrapped as
//     "lock: redis: master i: ...".
//
// The returned [Lock] works as one from [Obtain]: Refresh extends the lease
// on every master and succeeds when a majority did so within the validity
// time; TTL is the time until fewer than a majority hold it; Release deletes
// the key on every master; Hold renews it. Each such call asks all masters at
// once and waits at most the quorum wait for them, so a stalled master costs
// that wait, not the client's full timeout. A call to a master that has not
// answered in time is left to finish in its own goroutine, which ends with
// the client's timeouts; if it took the lock after the attempt failed or
// after Release, it releases it. With [WithToken], a failed attempt
// still releases the key on every master, even if the same token held it
// before.
//
// # Caveats
//
// Redlock is safe only under timing assumptions. Its validity time is
// measured on the client's clock and the expiries on each server's clock: a
// server whose clock jumps forward, a client paused (GC, a stopped VM) past
// the validity time, or a network delay longer than the lease can let two
// holders believe they hold the lock at once. Martin Kleppmann's critique
// ("How to do distributed locking", 2016) explains these cases; the Redis
// documentation answers it but does not remove them. A quorum lock hands out
// no fencing token ([Lock.Fence] is 0; its doc shows why counters on
// independent masters cannot give one), so a storage system cannot use it to
// reject the writes of a holder whose lease has ended. Use Redlock where a
// rare double run costs efficiency (the same e-mail sent twice, a job run
// twice); where it costs correctness, fence the writes in the store (a
// version column, a compare-and-set), use [Obtain] and its fence, or use a
// consensus system. A master that restarts without persistence forgets the
// locks it granted: keep it out for at least a ttl after a restart, or run
// it with appendfsync always. Against
// master-replica failover, Redlock does not help unless the N masters are
// independent.
//
// masters must not be empty or contain nil; they are used as given (each
// routes the single key itself, so a master may be a *redis.Client or
// another [redis.Scripter]). Invalid input gives an error, as in [Obtain].
// ObtainQuorum is safe for concurrent use.
func ObtainQuorum(ctx context.Context, masters []redis.Scripter, key string, ttl time.Duration, opts ...Option) (*Lock, error) {
	cfg, err := newConfig("ObtainQuorum", key, ttl, true, opts)
	if err != nil {
		return nil, err
	}
	if len(masters) == 0 {
		return nil, errors.New("lock: ObtainQuorum: no masters")
	}
	if slices.Contains(masters, nil) {
		return nil, errors.New("lock: ObtainQuorum: nil master")
	}
	l := newLock(slices.Clone(masters), len(masters)/2+1, cfg, key, ttl)
	l.redlock = true
	busy := make([]chan struct{}, len(masters))
	try := func(ctx context.Context, _ bool) (bool, error) { return l.tryQuorum(ctx, busy) }
	if err := l.obtain(ctx, cfg.retry, try, true); err != nil {
		return nil, err
	}
	return l, nil
}

// answer is one master's reply in a round: the script's number, or an error.
type answer struct {
	n   int64
	err error
}

var errNoAnswer = errors.New("no answer within the quorum wait")

// round runs call on every master at once and gathers the answers until all
// have answered, settled says the outcome is known (given the masters that
// said 1 and those that did not), or the deadline or ctx ends. A master that
// has not answered by then gets errNoAnswer, or ctx's error if ctx ended. Each call runs in a goroutine of
// its own that ends when the call does (bounded by the client's timeouts,
// and cancelled by finish); with after, that goroutine then waits for finish
// and runs after with its master's real answer and whether it came too late
// to be counted, to clean up. The caller must call finish once it has
// decided.
//
// With busy (one entry per master, nil or a channel), the call on master i
// waits until busy[i] is closed, and busy[i] is replaced by a channel that is
// closed once this round's goroutine for master i has ended, after included;
// a master still busy at the deadline is not asked and counts as not
// answering. The rounds of one ObtainQuorum share busy, so that an attempt
// never asks a master while the previous attempt's call or clean-up there is
// still running (see tryQuorum).
func (l *Lock) round(ctx context.Context, deadline time.Time,
	busy []chan struct{},
	call func(context.Context, redis.Scripter) (int64, error),
	settled func(yes, no int) bool,
	after func(i int, a answer, late bool),
) (answers []answer, finish func()) {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	r := &roundState{
		over:    make(chan struct{}),
		replies: make(chan reply, len(l.masters)),
		counted: make([]bool, len(l.masters)),
	}
	for i, m := range l.masters {
		prev, done := takeTurn(busy, i)
		go r.ask(rctx, i, m, prev, done, call, after)
	}
	answers = r.gather(ctx, rctx, settled)
	return answers, func() { cancel(); close(r.over) }
}

// reply is master i's answer, as its goroutine sends it to the round.
type reply struct {
	i int
	a answer
}

// roundState is what a round shares with its goroutines, one per master.
type roundState struct {
	over    chan struct{} // closed by finish: the round has decided
	replies chan reply    // room for every master: never blocks a sender
	counted []bool        // the answers gather counted; written before over is closed
}

// takeTurn queues this round's call on master i behind the previous round's
// in busy: the call waits for prev (nil: nothing to wait for) and its
// goroutine closes done when it ends. Without busy both are nil.
func takeTurn(busy []chan struct{}, i int) (prev, done chan struct{}) {
	if busy == nil {
		return nil, nil
	}
	prev, done = busy[i], make(chan struct{})
	busy[i] = done
	return prev, done
}

// ask is the goroutine of master i: it waits for prev, runs call, sends the
// answer to the round and, with after, runs after with it once the round
// has decided. A round that ends while prev is still open leaves master i
// unasked.
func (r *roundState) ask(ctx context.Context, i int, m redis.Scripter, prev, done chan struct{},
	call func(context.Context, redis.Scripter) (int64, error),
	after func(i int, a answer, late bool),
) {
	if done != nil {
		defer close(done)
	}
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			<-prev // keep the chain: done closes after prev
			return
		}
	}
	n, err := call(ctx, m)
	r.replies <- reply{i, answer{n, err}}
	if after != nil {
		<-r.over
		after(i, answer{n, err}, !r.counted[i])
	}
}

// gather collects the replies until every master answered, settled says the
// outcome is known, or rctx (the round's deadline) ends. A master that did
// not answer keeps errNoAnswer, or gets ctx's error when the caller's
// context, not the wait, ended the round.
func (r *roundState) gather(ctx, rctx context.Context, settled func(yes, no int) bool) []answer {
	answers := make([]answer, len(r.counted))
	for i := range answers {
		answers[i].err = errNoAnswer
	}
	yes, no := 0, 0
wait:
	for left := len(answers); left > 0 && (settled == nil || !settled(yes, no)); left-- {
		select {
		case rp := <-r.replies:
			answers[rp.i], r.counted[rp.i] = rp.a, true
			if rp.a.err == nil && rp.a.n == 1 {
				yes++
			} else {
				no++
			}
		case <-rctx.Done():
			break wait
		}
	}
	if err := ctx.Err(); err != nil {
		for i := range answers {
			if !r.counted[i] {
				answers[i].err = err
			}
		}
	}
	return answers
}

// tryQuorum is one attempt of the Redlock algorithm (see [ObtainQuorum]).
//
// Every attempt of one ObtainQuorum sends the same value, so a master cannot
// tell them apart: the release that cleans up after a failed attempt (a grant
// it did not count, or any grant once it failed) would delete the key just as
// well if a later attempt had counted it in the meantime, either by setting
// it again or by finding it "already ours". That later attempt would then
// believe it holds a majority that it does not, and a second client could
// take the lock on the masters it lost. busy (shared by the attempts, see
// round) prevents this: an attempt asks a master only once the previous
// attempt's call and clean-up on that master have ended.
func (l *Lock) tryQuorum(ctx context.Context, busy []chan struct{}) (bool, error) {
	ttl := l.lease()
	ms := leaseMillis(ttl)
	start := time.Now()
	validUntil, deadline := l.window(start, ttl)
	keys := []string{l.key}
	won := false // written before finish, read by the clean-up
	answers, finish := l.round(ctx, deadline, busy,
		func(ctx context.Context, m redis.Scripter) (int64, error) {
			return lockObtainScript.Run(ctx, m, keys, l.value, l.tokenLen, ms).Int64()
		},
		// Wait for every master while success is possible, so that the lock
		// is set on as many as answer within the wait; give up early once
		// a majority is out of reach.
		func(yes, no int) bool { return no > len(l.masters)-l.quorum },
		l.cleanUp(ctx, &won))
	yes := granted(answers)
	elapsed := time.Since(start)
	won = yes >= l.quorum && time.Now().Before(validUntil)
	finish()
	if won {
		l.setValid(start, ttl)
		return true, nil
	}
	errs := masterErrs(answers)
	if yes >= l.quorum {
		errs = append(errs, fmt.Errorf("lock: a quorum granted the lock after %v, past its validity (ttl %v - drift %v)",
			elapsed.Round(time.Millisecond), ttl, clockDrift(ttl)))
	}
	return false, errors.Join(errs...)
}

// window is when a lease of ttl asked for at start stops being valid on the
// client's clock (ttl less the clock drift), and when its round stops
// waiting for the masters: the quorum wait, or the validity if it ends first.
func (l *Lock) window(start time.Time, ttl time.Duration) (validUntil, deadline time.Time) {
	validUntil = start.Add(ttl - clockDrift(ttl))
	deadline = start.Add(l.wait)
	if validUntil.Before(deadline) {
		deadline = validUntil
	}
	return validUntil, deadline
}

// cleanUp is an attempt's after (see round): it releases master i's grant
// unless that grant is part of the lock the attempt won (*won, read once the
// round has decided) and the lock is still held. A grant counted in a won
// lock, or one that came late while the lock is held, is Release's to undo.
func (l *Lock) cleanUp(ctx context.Context, won *bool) func(i int, a answer, late bool) {
	return func(i int, a answer, late bool) {
		switch {
		case a.err == nil && a.n == 0:
			return // not ours
		case *won && !late:
			return // part of the lock: Release will see to it
		case *won && !isClosed(l.released):
			return // granted late, but the lock is still held: Release will see to it
		}
		l.releaseOn(ctx, l.masters[i]) // a failed attempt, or granted after Release
	}
}

// releaseOn releases the lock on one master, bounded by the lease (after
// which Redis has dropped it anyway) and by 5s.
func (l *Lock) releaseOn(ctx context.Context, m redis.Scripter) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.lease(), 5*time.Second))
	defer cancel()
	_ = lockReleaseScript.Run(ctx, m, []string{l.key}, l.value).Err()
}

func (l *Lock) releaseQuorum(ctx context.Context) error {
	keys := []string{l.key}
	answers, finish := l.round(ctx, time.Now().Add(l.wait), nil,
		func(ctx context.Context, m redis.Scripter) (int64, error) {
			return lockReleaseScript.Run(ctx, m, keys, l.value).Int64()
		}, nil, nil)
	finish()
	if granted(answers) >= l.quorum {
		return nil
	}
	if errs := masterErrs(answers); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return ErrNotHeld
}

func (l *Lock) refreshQuorum(ctx context.Context, start time.Time, ttl time.Duration) error {
	ms := leaseMillis(ttl)
	keys := []string{l.key}
	validUntil, deadline := l.window(start, ttl)
	answers, finish := l.round(ctx, deadline, nil,
		func(ctx context.Context, m redis.Scripter) (int64, error) {
			return lockRefreshScript.Run(ctx, m, keys, l.value, ms).Int64()
		}, nil, nil)
	finish()
	if granted(answers) >= l.quorum && time.Now().Before(validUntil) {
		return nil
	}
	if notOurs(answers) > len(l.masters)-l.quorum {
		return ErrNotHeld
	}
	errs := masterErrs(answers)
	if len(errs) == 0 {
		errs = append(errs, errors.New("lock: a quorum extended the lock after its validity"))
	}
	return errors.Join(errs...)
}

func (l *Lock) ttlQuorum(ctx context.Context) (time.Duration, error) {
	keys := []string{l.key}
	answers, finish := l.round(ctx, time.Now().Add(l.wait), nil,
		func(ctx context.Context, m redis.Scripter) (int64, error) {
			return lockPTTLScript.Run(ctx, m, keys, l.value).Int64()
		}, nil, nil)
	finish()
	var ttls []time.Duration
	var errs []error
	others := 0
	for i, a := range answers {
		d, err := pttl(a.n, a.err)
		switch {
		case errors.Is(err, ErrNotHeld):
			others++
		case err != nil:
			errs = append(errs, masterErr(i, a.err))
		case d < 0:
			ttls = append(ttls, math.MaxInt64) // no expiry
		default:
			ttls = append(ttls, d)
		}
	}
	if len(ttls) >= l.quorum {
		slices.Sort(ttls)
		slices.Reverse(ttls)
		if d := ttls[l.quorum-1]; d != math.MaxInt64 {
			return d, nil
		}
		return -1, nil
	}
	if others > len(l.masters)-l.quorum {
		return 0, ErrNotHeld
	}
	return 0, errors.Join(errs...)
}

// granted counts the masters that answered 1.
func granted(answers []answer) int {
	n := 0
	for _, a := range answers {
		if a.err == nil && a.n == 1 {
			n++
		}
	}
	return n
}

// notOurs counts the masters that answered that the lock is not ours.
func notOurs(answers []answer) int {
	n := 0
	for _, a := range answers {
		if a.err == nil && a.n == 0 {
			n++
		}
	}
	return n
}

func masterErrs(answers []answer) []error {
	var errs []error
	for i, a := range answers {
		if a.err != nil {
			errs = append(errs, masterErr(i, a.err))
		}
	}
	return errs
}

func masterErr(i int, err error) error { return fmt.Errorf("lock: redis: master %d: %w", i, err) }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
