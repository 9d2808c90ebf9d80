// notify.go wakes waiters when the holder of a key's load lock commits or
// releases, instead of leaving them to their poll interval: the scripts
// publish the key on a channel of its cluster slot named under the cache's
// prefix, and the Caches on one client share one subscription per Redis
// master.

package cache

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/slot"
)

// notifyInfix follows the slot tag in every channel name.
const notifyInfix = ":stampede:notify"

// notifyChannel is the channel on which the commit and the release of key's
// load lock are announced, for a cache with the given prefix: one channel per
// prefix and slot, in the slot of its keys, and under the prefix so that an
// ACL channel pattern that grants the prefix ("&product:*") grants it:
//
//   - prefix+"{T}:stampede:notify", T hashing to key's slot, when the prefix
//     has no '{' (the first '{' is then T's);
//   - prefix+"{}:stampede:notify" when the prefix has a hash tag: every key of
//     the cache is in the prefix's slot, and so is this one channel;
//   - "{T}:stampede:notify:"+prefix when the prefix has a '{' that opens no
//     hash tag: the one shape outside the prefix (no name starting with such a
//     prefix can be placed in a chosen slot).
func notifyChannel(prefix, key string) string {
	switch {
	case hasHashTag(prefix):
		return prefix + "{}" + notifyInfix
	case strings.IndexByte(prefix, '{') < 0:
		return prefix + "{" + slot.Tag(slot.Of(key)) + "}" + notifyInfix
	}
	return "{" + slot.Tag(slot.Of(key)) + "}" + notifyInfix + ":" + prefix
}

var (
	// notifyIdle is how long a subscription stays open without a waiter
	// before it is closed, with its connection and its goroutine.
	notifyIdle = 30 * time.Second
	// notifyRetry is how long waits on a master (or a channel) whose
	// subscription failed only poll before subscribing again: a broken
	// server costs one attempt per notifyRetry, not one per wait.
	notifyRetry = time.Second
)

// errUnsharded answers a subscribe sent with SSUBSCRIBE to a server without
// it (Redis < 7): subscribe again, with SUBSCRIBE.
var errUnsharded = errors.New("cache: no SSUBSCRIBE on this server")

// notifier delivers the announcements to waiters. It subscribes lazily, on
// the first wait for a channel, with one PubSub (one connection and one
// goroutine) per Redis master: SSUBSCRIBE, or SUBSCRIBE on a server that
// does not know it (Redis < 7, where the scripts PUBLISH instead of
// SPUBLISH: both follow from the server's version). A subscription with no
// waiter for notifyIdle is closed; so are all of them by close, and a
// subscription's goroutine also ends when its connection fails (closing the
// Redis client closes it). A connection that fails silently is found by a
// PING after a wait ran out (see probe). A broken subscription is replaced
// by a later wait, notifyRetry after it broke.
//
// A nil *notifier (a client it cannot subscribe on, such as a redis.Ring or
// another UniversalClient than *redis.Client and *redis.ClusterClient) only
// sleeps: its waiters poll. So do waits whose subscription failed or is not
// confirmed in time: a lost message, a reconnect or a slot moving away costs
// at most one backoff, never a hang. Safe for concurrent use.
//
// Each Cache holds a notifier of its own prefix (which names its channels,
// see notifyChannel) over the notifyHub of its client: caches with other
// prefixes subscribe other channels on the same subscriptions, and a message
// wakes the waits for its key, whichever channel brought it.
type notifier struct {
	*notifyHub
	prefix string
}

// notifyHub is the state of a client's subscriptions, shared by the
// notifiers of every prefix.
type notifyHub struct {
	rdb     redis.UniversalClient // a *redis.Client or a *redis.ClusterClient
	cluster *redis.ClusterClient  // rdb, when it is a cluster: one PubSub per master
	plain   bool                  // SUBSCRIBE even where SSUBSCRIBE exists (tests)
	timeout time.Duration         // bounds a subscribe: the client's dial plus write timeouts

	mu        sync.Mutex
	subs      map[string]*subscription // protected by mu; by master address ("" for a *redis.Client)
	unsharded map[string]bool          // protected by mu; masters without SSUBSCRIBE
	notBefore map[string]time.Time     // protected by mu; masters and channels ("#"+name) that failed
	closed    bool                     // protected by mu
	loops     sync.WaitGroup           // the message loops of the subscriptions, and subscribes in flight
}

func newNotifier(rdb redis.UniversalClient) *notifier {
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		return &notifier{notifyHub: &notifyHub{rdb: c, timeout: subscribeTimeout(o.DialTimeout, o.WriteTimeout)}}
	case *redis.ClusterClient:
		o := c.Options()
		return &notifier{notifyHub: &notifyHub{rdb: c, cluster: c, timeout: subscribeTimeout(o.DialTimeout, o.WriteTimeout)}}
	}
	return nil
}

// withPrefix returns a notifier for the channels of a cache with prefix p,
// sharing n's subscriptions; nil if n is nil.
func (n *notifier) withPrefix(p string) *notifier {
	if n == nil {
		return nil
	}
	return &notifier{notifyHub: n.notifyHub, prefix: p}
}

// subscribeTimeout is how long a subscribe may take: a dial and a write,
// by the client's own timeouts (negative ones mean none: then go-redis's
// defaults, 5s and 3s).
func subscribeTimeout(dial, write time.Duration) time.Duration {
	if dial <= 0 {
		dial = 5 * time.Second
	}
	if write <= 0 {
		write = 3 * time.Second
	}
	return dial + write
}

// goSubscribe sends the subscribe of cs on a goroutine of its own, bounded
// by n.timeout rather than by the deadline of the wait that asked for it:
// a dial slower than one backoff (a loaded machine, a far server) would
// otherwise kill the new subscription and leave the master polled for
// notifyRetry. The wait goes on waiting on cs.ready, its timer and its ctx
// as before. The goroutine ends with the subscribe; close waits for it.
func (n *notifier) goSubscribe(s *subscription, cs *channelSub) {
	n.mu.Lock()
	if n.closed {
		cs.err = redis.ErrClosed
		close(cs.ready)
		n.mu.Unlock()
		return
	}
	n.loops.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.loops.Done()
		ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
		defer cancel()
		s.subscribe(ctx, cs)
	}()
}

// subscription is one PubSub: one connection to one master, and the
// goroutine that reads it (started with the first subscribe, ended by
// closing the PubSub). Its fields other than n, addr, ps, sharded and wmu
// are protected by n.mu.
type subscription struct {
	n       *notifier
	addr    string
	ps      *redis.PubSub
	sharded bool
	wmu     sync.Mutex // serializes subscribe commands, so pending is in their order

	chans   map[string]*channelSub // subscribed or being subscribed
	pending []*channelSub          // subscribes sent and not yet answered, oldest first
	keys    map[string]*keyWait    // keys waited for, and for a moment after
	sweepAt int                    // len(keys) at which stale entries are swept
	waits   int                    // waits in progress
	idleGen int                    // invalidates an idle timer that was stopped too late
	idle    *time.Timer            // closes the subscription after notifyIdle without waits
	started bool                   // the message loop runs
	dead    bool                   // closed or broken: replaced on a later wait
	pingAt  time.Time              // when the last PING was sent
	pinging bool                   // its PONG has not come back
}

// channelSub is the state of one channel's subscribe.
type channelSub struct {
	name  string
	ready chan struct{} // closed when the server answered
	err   error         // the answer, if not a confirmation
	ok    bool          // confirmed
}

// keyWait is what the waits for one key share: ch is closed by a message
// with the key. The entry outlives the wait by its backoff, so that a
// message that arrives while the caller re-reads wakes its next wait.
type keyWait struct {
	ch      chan struct{}
	fired   bool
	n       int       // waits in progress
	expires time.Time // when no wait is in progress: forget the entry after
}

// channel is what the scripts publish on for key; "" when nobody listens.
func (n *notifier) channel(key string) string {
	if n == nil {
		return ""
	}
	return notifyChannel(n.prefix, key)
}

// wait blocks until the lock of key is committed or released (true), d
// passes or ctx ends (false). The first wait for a channel subscribes to it
// and returns false as soon as the server confirms, so that the caller
// re-reads: a commit published before the subscription is not missed.
func (n *notifier) wait(ctx context.Context, key string, d time.Duration) bool {
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	if n != nil {
		r := n.waitOn(ctx, key, d, t)
		if r == waitRetry { // the server has no SSUBSCRIBE: once more, with SUBSCRIBE
			r = n.waitOn(ctx, key, d, t)
		}
		switch r {
		case waitWoken:
			return true
		case waitDone:
			return false
		}
	}
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// waitResult is how a wait through a subscription ended.
type waitResult uint8

const (
	waitDone  waitResult = iota // the timer fired, ctx ended, or a subscribe was confirmed
	waitWoken                   // a message for the key
	waitPoll                    // no subscription to wait on: sleep instead
	waitRetry                   // subscribe again (with SUBSCRIBE)
)

// waitOn is one wait through the subscription of key's master.
func (n *notifier) waitOn(ctx context.Context, key string, d time.Duration, t *time.Timer) waitResult {
	ch := notifyChannel(n.prefix, key)
	addr := ""
	if n.cluster != nil {
		m, err := n.cluster.MasterForKey(ctx, ch)
		if err != nil {
			return waitPoll
		}
		addr = m.Options().Addr
	}
	s, cs, kw, subscribe, fired := n.enter(ctx, addr, key, ch)
	if s == nil {
		return waitPoll
	}
	if fired {
		n.leave(s, key, kw, true, d)
		return waitWoken
	}
	if subscribe {
		n.goSubscribe(s, cs)
	}
	var ready <-chan struct{}
	if cs != nil {
		n.mu.Lock()
		if !cs.ok || subscribe {
			ready = cs.ready // not confirmed when this wait began
		}
		n.mu.Unlock()
	}
	for {
		select {
		case <-kw.ch:
			n.leave(s, key, kw, true, d)
			return waitWoken
		case <-ready:
			n.mu.Lock()
			ok, err := cs.ok, cs.err
			n.mu.Unlock()
			if ok { // confirmed during this wait: the caller re-reads
				n.leave(s, key, kw, false, d)
				return waitDone
			}
			if errors.Is(err, errUnsharded) {
				n.leave(s, key, kw, false, d)
				return waitRetry
			}
			ready = nil // refused or broken: poll
		case <-t.C:
			n.leave(s, key, kw, false, d)
			n.probe(s) // no message, no confirmation: is the connection alive?
			return waitDone
		case <-ctx.Done():
			n.leave(s, key, kw, false, d)
			return waitDone
		}
	}
}

// enter registers a wait for key on the subscription of master addr,
// creating it if needed. It returns a nil s when the wait must poll, fired
// when a message for key arrived since the previous wait, and subscribe
// when this wait must subscribe to channel ch (then cs is new).
func (n *notifier) enter(ctx context.Context, addr, key, ch string) (s *subscription, cs *channelSub, kw *keyWait, subscribe, fired bool) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, nil, nil, false, false
	}
	s = n.subs[addr]
	if s == nil || s.dead {
		if now.Before(n.notBefore[addr]) {
			return nil, nil, nil, false, false
		}
		s = n.newSubscription(ctx, addr)
	}
	s.waits++
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	s.idleGen++

	kw = s.keys[key]
	if kw != nil && kw.n == 0 && now.After(kw.expires) {
		kw = nil
	}
	if kw == nil {
		kw = &keyWait{ch: make(chan struct{})}
		s.keys[key] = kw
	}
	kw.n++
	if kw.fired {
		return s, nil, kw, false, true
	}

	cs = s.chans[ch]
	if cs == nil {
		if now.Before(n.notBefore["#"+ch]) {
			return s, nil, kw, false, false // poll, registered (and counted) all the same
		}
		cs = &channelSub{name: ch, ready: make(chan struct{})}
		s.chans[ch] = cs
		subscribe = true
	}
	return s, cs, kw, subscribe, false
}

// newSubscription replaces the subscription of master addr. No I/O: the
// connection is made by the first subscribe. Called with n.mu held.
func (n *notifier) newSubscription(ctx context.Context, addr string) *subscription {
	s := &subscription{
		n:       n,
		addr:    addr,
		sharded: !n.plain && !n.unsharded[addr],
		chans:   map[string]*channelSub{},
		keys:    map[string]*keyWait{},
		sweepAt: 64,
	}
	if s.sharded {
		s.ps = n.rdb.SSubscribe(ctx)
	} else {
		s.ps = n.rdb.Subscribe(ctx)
	}
	if n.subs == nil {
		n.subs = map[string]*subscription{}
	}
	n.subs[addr] = s
	return s
}

// leave ends a wait for key. A woken wait consumes the message; any other
// keeps the entry for d, for a message that arrives before the next wait.
func (n *notifier) leave(s *subscription, key string, kw *keyWait, woken bool, d time.Duration) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	kw.n--
	if kw.n == 0 {
		kw.expires = now.Add(d)
		if woken && s.keys[key] == kw {
			delete(s.keys, key)
		}
	}
	if len(s.keys) >= s.sweepAt {
		for k, w := range s.keys {
			if w.n == 0 && now.After(w.expires) {
				delete(s.keys, k)
			}
		}
		s.sweepAt = max(64, 2*len(s.keys))
	}
	s.waits--
	if s.waits == 0 && !s.dead {
		gen := s.idleGen
		s.idle = time.AfterFunc(notifyIdle, func() { n.idleClose(s, gen) })
	}
}

// subscribe sends the subscribe of cs and starts the message loop with the
// first one. A failure to send breaks the subscription.
func (s *subscription) subscribe(ctx context.Context, cs *channelSub) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	n := s.n
	n.mu.Lock()
	if s.dead {
		cs.err = redis.ErrClosed
		if s.sharded && n.unsharded[s.addr] {
			// Another subscribe on s was refused for want of SSUBSCRIBE
			// (Redis < 7) before this one was sent: this wait retries with
			// SUBSCRIBE too, instead of polling.
			cs.err = errUnsharded
		}
		close(cs.ready)
		n.mu.Unlock()
		return
	}
	s.pending = append(s.pending, cs)
	n.mu.Unlock()
	var err error
	if s.sharded {
		err = s.ps.SSubscribe(ctx, cs.name)
	} else {
		err = s.ps.Subscribe(ctx, cs.name)
	}
	if err != nil {
		n.kill(s, err, notifyRetry)
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !s.started && !s.dead && !n.closed {
		s.started = true
		n.loops.Add(1)
		go s.loop()
	}
}

// loop reads the subscription's connection until it is closed or fails:
// confirmations and errors answer the subscribes in order, messages wake
// the waits for their key.
func (s *subscription) loop() {
	defer s.n.loops.Done()
	ctx := context.Background()
	for {
		msg, err := s.ps.Receive(ctx)
		if err != nil {
			var reply redis.Error
			if errors.As(err, &reply) && s.n.answer("", err, s) {
				continue
			}
			s.n.kill(s, err, notifyRetry)
			_ = s.ps.Close() // if it was killed before
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				s.n.answer(m.Channel, nil, s)
			case "unsubscribe", "sunsubscribe": // the slot moved away: subscribe again where it is
				s.n.dropped(s, m.Channel)
			}
		case *redis.Message:
			s.n.deliver(s, m.Payload)
		case *redis.Pong:
			s.n.mu.Lock()
			s.pinging = false
			s.n.mu.Unlock()
		}
	}
}

// answer applies the server's answer to a subscribe: a confirmation of
// channel, or an error reply (which names no channel: it answers the oldest
// pending subscribe). It reports false if the subscription is done for.
func (n *notifier) answer(channel string, err error, s *subscription) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.dead {
		return false
	}
	i := 0
	if err == nil {
		for i < len(s.pending) && s.pending[i].name != channel {
			i++
		}
	}
	if i == len(s.pending) {
		return err == nil // a confirmation nobody waits for is harmless; an error is not
	}
	cs := s.pending[i]
	s.pending = append(s.pending[:i], s.pending[i+1:]...)
	switch {
	case err == nil:
		cs.ok = true
	case s.sharded && isUnknownCommand(err):
		cs.err = errUnsharded
		close(cs.ready)
		n.killLocked(s, errUnsharded, 0) // the loop closes the PubSub
		return false
	default: // a refusal of this channel (MOVED, NOPERM...): poll it for a while
		cs.err = err
		if s.chans[cs.name] == cs {
			delete(s.chans, cs.name)
		}
		n.backOff("#" + cs.name)
	}
	close(cs.ready)
	return true
}

func isUnknownCommand(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// errNoPong breaks a subscription whose connection did not answer a PING.
var errNoPong = errors.New("cache: pub/sub connection did not answer PING")

// probe is called when a wait on s ran out, which a dead connection that
// did not say so (a half-open TCP connection, replies lost on the way) also
// causes: it sends a PING, at most one per notifyRetry, and a PING still
// unanswered after notifyRetry breaks s, to be replaced.
func (n *notifier) probe(s *subscription) {
	now := time.Now()
	n.mu.Lock()
	if s.dead || !s.started || now.Sub(s.pingAt) < notifyRetry {
		n.mu.Unlock()
		return
	}
	if s.pinging {
		n.mu.Unlock()
		n.kill(s, errNoPong, notifyRetry)
		return
	}
	s.pingAt, s.pinging = now, true
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), notifyRetry)
	defer cancel()
	if err := s.ps.Ping(ctx); err != nil {
		n.kill(s, err, notifyRetry)
	}
}

// dropped forgets a channel the server unsubscribed.
func (n *notifier) dropped(s *subscription, channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := s.chans[channel]; cs != nil && cs.ok {
		delete(s.chans, channel)
	}
}

// deliver wakes the waits for key.
func (n *notifier) deliver(s *subscription, key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if kw := s.keys[key]; kw != nil && !kw.fired {
		kw.fired = true
		close(kw.ch)
	}
}

// kill closes s, fails its pending subscribes with err and, if retry > 0
// (a broken connection), lets waits on its master only poll for retry.
func (n *notifier) kill(s *subscription, err error, retry time.Duration) {
	n.mu.Lock()
	killed := n.killLocked(s, err, retry)
	n.mu.Unlock()
	if killed {
		_ = s.ps.Close() // ends the loop
	}
}

// killLocked is kill without closing the PubSub, which the caller must do
// (after unlocking: Close takes the PubSub's lock, which a subscribe holds
// while it dials) if it reports true. Called with n.mu held.
func (n *notifier) killLocked(s *subscription, err error, retry time.Duration) bool {
	if s.dead {
		return false
	}
	s.dead = true
	if n.subs[s.addr] == s {
		delete(n.subs, s.addr)
	}
	switch {
	case errors.Is(err, errUnsharded):
		if n.unsharded == nil {
			n.unsharded = map[string]bool{}
		}
		n.unsharded[s.addr] = true
	case retry > 0:
		delete(n.unsharded, s.addr) // the server there may change: learnt again
		n.backOff(s.addr)
	}
	for _, cs := range s.pending {
		cs.err = err
		close(cs.ready)
	}
	s.pending = nil
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	return true
}

// backOff lets waits on name (a master, or "#" and a channel) only poll for
// notifyRetry. Called with n.mu held.
func (n *notifier) backOff(name string) {
	if n.notBefore == nil {
		n.notBefore = map[string]time.Time{}
	}
	now := time.Now()
	for k, t := range n.notBefore {
		if now.After(t) {
			delete(n.notBefore, k)
		}
	}
	n.notBefore[name] = now.Add(notifyRetry)
}

// idleClose closes s if it had no wait since the idle timer of generation
// gen was set.
func (n *notifier) idleClose(s *subscription, gen int) {
	n.mu.Lock()
	killed := s.waits == 0 && s.idleGen == gen && n.killLocked(s, redis.ErrClosed, 0)
	n.mu.Unlock()
	if killed {
		_ = s.ps.Close()
	}
}

// close ends the subscriptions and waits for their goroutines. Later waits
// poll. Safe to call more than once, concurrently.
func (n *notifier) close() {
	if n == nil {
		return
	}
	n.mu.Lock()
	n.closed = true
	subs := make([]*subscription, 0, len(n.subs))
	for _, s := range n.subs {
		subs = append(subs, s)
	}
	n.mu.Unlock()
	for _, s := range subs {
		n.kill(s, redis.ErrClosed, 0)
	}
	n.loops.Wait()
}
