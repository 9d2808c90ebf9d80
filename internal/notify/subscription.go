// This file is one PubSub on one master: its subscribes and its read loop.

package notify

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/rediserr"
)

// subscription is one PubSub: one connection to one master, and the
// goroutine that reads it (started with the first subscribe, ended by
// closing the PubSub). Its fields other than h, addr, ps, sharded and wmu
// are protected by h.mu.
type subscription struct {
	h       *subscriber
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
	idle    *time.Timer            // closes the subscription after idleAfter without waits
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

// subscribe sends the subscribe of cs and starts the message loop with the
// first one. A failure to send breaks the subscription.
func (s *subscription) subscribe(ctx context.Context, cs *channelSub) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	h := s.h
	h.mu.Lock()
	if s.dead {
		cs.err = redis.ErrClosed
		if s.sharded && h.unsharded[s.addr] {
			// Another subscribe on s was refused for want of SSUBSCRIBE
			// (Redis < 7) before this one was sent: this wait retries with
			// SUBSCRIBE too, instead of polling.
			cs.err = errUnsharded
		}
		close(cs.ready)
		h.mu.Unlock()
		return
	}
	s.pending = append(s.pending, cs)
	h.mu.Unlock()
	var err error
	if s.sharded {
		err = s.ps.SSubscribe(ctx, cs.name)
	} else {
		err = s.ps.Subscribe(ctx, cs.name)
	}
	if err != nil {
		h.kill(s, err, RetryAfter)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !s.started && !s.dead && !h.closed {
		s.started = true
		h.loops.Add(1)
		go s.loop()
	}
}

// loop reads the subscription's connection until it is closed or fails:
// confirmations and errors answer the subscribes in order, messages wake
// the waits for their key.
func (s *subscription) loop() {
	defer s.h.loops.Done()
	ctx := context.Background()
	for {
		msg, err := s.ps.Receive(ctx)
		if err != nil {
			var reply redis.Error
			if errors.As(err, &reply) && s.h.answer("", err, s) {
				continue
			}
			s.h.kill(s, err, RetryAfter)
			_ = s.ps.Close() // if it was killed before
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				s.h.answer(m.Channel, nil, s)
			case "unsubscribe", "sunsubscribe": // the slot moved away: subscribe again where it is
				s.h.dropped(s, m.Channel)
			}
		case *redis.Message:
			s.h.deliver(s, m.Payload)
		case *redis.Pong:
			s.h.mu.Lock()
			s.pinging = false
			s.h.mu.Unlock()
		}
	}
}

// answer applies the server's answer to a subscribe: a confirmation of
// channel, or an error reply (which names no channel: it answers the oldest
// pending subscribe). It reports false if the subscription is done for.
func (h *subscriber) answer(channel string, err error, s *subscription) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
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
	case s.sharded && rediserr.IsUnknownCommand(err):
		cs.err = errUnsharded
		close(cs.ready)
		h.killLocked(s, errUnsharded, 0) // the loop closes the PubSub
		return false
	default: // a refusal of this channel (MOVED, NOPERM...): poll it for a while
		cs.err = err
		if s.chans[cs.name] == cs {
			delete(s.chans, cs.name)
		}
		h.backOff("#" + cs.name)
	}
	close(cs.ready)
	return true
}

// dropped forgets a channel the server unsubscribed.
func (h *subscriber) dropped(s *subscription, channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs := s.chans[channel]; cs != nil && cs.ok {
		delete(s.chans, channel)
	}
}

// deliver wakes the waits for key.
func (h *subscriber) deliver(s *subscription, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if kw := s.keys[key]; kw != nil && !kw.fired {
		kw.fired = true
		close(kw.ch)
	}
}
