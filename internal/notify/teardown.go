// This file ends subscriptions (broken, silent, refused, idle, closed) and backs off.

package notify

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// errUnsharded answers a subscribe sent with SSUBSCRIBE to a server without
// it (Redis < 7): subscribe again, with SUBSCRIBE.
var errUnsharded = errors.New("notify: no SSUBSCRIBE on this server")

// errNoPong breaks a subscription whose connection did not answer a PING.
var errNoPong = errors.New("notify: pub/sub connection did not answer PING")

// probe is called when a wait on s ran out, which a dead connection that
// did not say so (a half-open TCP connection, replies lost on the way) also
// causes: it sends a PING, at most one per RetryAfter, and a PING still
// unanswered after RetryAfter breaks s, to be replaced.
func (h *subscriber) probe(s *subscription) {
	now := time.Now()
	h.mu.Lock()
	if s.dead || !s.started || now.Sub(s.pingAt) < RetryAfter {
		h.mu.Unlock()
		return
	}
	if s.pinging {
		h.mu.Unlock()
		h.kill(s, errNoPong, RetryAfter)
		return
	}
	s.pingAt, s.pinging = now, true
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), RetryAfter)
	defer cancel()
	if err := s.ps.Ping(ctx); err != nil {
		h.kill(s, err, RetryAfter)
	}
}

// kill closes s, fails its pending subscribes with err and, if retry > 0
// (a broken connection), lets waits on its master only poll for retry.
func (h *subscriber) kill(s *subscription, err error, retry time.Duration) {
	h.mu.Lock()
	killed := h.killLocked(s, err, retry)
	h.mu.Unlock()
	if killed {
		_ = s.ps.Close() // ends the loop
	}
}

// killLocked is kill without closing the PubSub, which the caller must do
// (after unlocking: Close takes the PubSub's lock, which a subscribe holds
// while it dials) if it reports true. Called with h.mu held.
func (h *subscriber) killLocked(s *subscription, err error, retry time.Duration) bool {
	if s.dead {
		return false
	}
	s.dead = true
	if h.subs[s.addr] == s {
		delete(h.subs, s.addr)
	}
	switch {
	case errors.Is(err, errUnsharded):
		if h.unsharded == nil {
			h.unsharded = map[string]bool{}
		}
		h.unsharded[s.addr] = true
	case retry > 0:
		delete(h.unsharded, s.addr) // the server there may change: learnt again
		h.backOff(s.addr)
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
// RetryAfter. Called with h.mu held.
func (h *subscriber) backOff(name string) {
	if h.notBefore == nil {
		h.notBefore = map[string]time.Time{}
	}
	now := time.Now()
	for k, t := range h.notBefore {
		if now.After(t) {
			delete(h.notBefore, k)
		}
	}
	h.notBefore[name] = now.Add(RetryAfter)
}

// idleClose closes s if it had no wait since the idle timer of generation
// gen was set.
func (h *subscriber) idleClose(s *subscription, gen int) {
	h.mu.Lock()
	killed := s.waits == 0 && s.idleGen == gen && h.killLocked(s, redis.ErrClosed, 0)
	h.mu.Unlock()
	if killed {
		_ = s.ps.Close()
	}
}
