// This file is one wait for a key on the subscription of its master.

package notify

import (
	"context"
	"errors"
	"time"
)

// keyWait is what the waits for one key share: ch is closed by a message
// with the key. The entry outlives the wait by its backoff, so that a
// message that arrives while the caller re-reads wakes its next wait.
type keyWait struct {
	ch      chan struct{}
	fired   bool
	n       int       // waits in progress
	expires time.Time // when no wait is in progress: forget the entry after
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
func (n *Notifier) waitOn(ctx context.Context, key string, d time.Duration, t *time.Timer) waitResult {
	ch := Channel(n.prefix, key)
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
func (h *subscriber) enter(ctx context.Context, addr, key, ch string) (s *subscription, cs *channelSub, kw *keyWait, subscribe, fired bool) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, nil, false, false
	}
	s = h.subs[addr]
	if s == nil || s.dead {
		if now.Before(h.notBefore[addr]) {
			return nil, nil, nil, false, false
		}
		s = h.newSubscription(ctx, addr)
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
		if now.Before(h.notBefore["#"+ch]) {
			return s, nil, kw, false, false // poll, registered (and counted) all the same
		}
		cs = &channelSub{name: ch, ready: make(chan struct{})}
		s.chans[ch] = cs
		subscribe = true
	}
	return s, cs, kw, subscribe, false
}

// leave ends a wait for key. A woken wait consumes the message; any other
// keeps the entry for d, for a message that arrives before the next wait.
func (h *subscriber) leave(s *subscription, key string, kw *keyWait, woken bool, d time.Duration) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
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
		s.idle = time.AfterFunc(idleAfter, func() { h.idleClose(s, gen) })
	}
}
