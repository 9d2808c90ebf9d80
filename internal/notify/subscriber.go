// This file holds the state of a client's subscriptions, shared by every prefix.

package notify

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscriber is the state of a client's subscriptions, shared by the Notifiers of
// every prefix.
type subscriber struct {
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

// newSubscription replaces the subscription of master addr. No I/O: the
// connection is made by the first subscribe. Called with h.mu held.
func (h *subscriber) newSubscription(ctx context.Context, addr string) *subscription {
	s := &subscription{
		h:       h,
		addr:    addr,
		sharded: !h.plain && !h.unsharded[addr],
		chans:   map[string]*channelSub{},
		keys:    map[string]*keyWait{},
		sweepAt: 64,
	}
	if s.sharded {
		s.ps = h.rdb.SSubscribe(ctx)
	} else {
		s.ps = h.rdb.Subscribe(ctx)
	}
	if h.subs == nil {
		h.subs = map[string]*subscription{}
	}
	h.subs[addr] = s
	return s
}

// goSubscribe sends the subscribe of cs on a goroutine of its own, bounded
// by h.timeout rather than by the deadline of the wait that asked for it:
// a dial slower than one backoff (a loaded machine, a far server) would
// otherwise kill the new subscription and leave the master polled for
// RetryAfter. The wait goes on waiting on cs.ready, its timer and its ctx
// as before. The goroutine ends with the subscribe; Close waits for it.
func (h *subscriber) goSubscribe(s *subscription, cs *channelSub) {
	h.mu.Lock()
	if h.closed {
		cs.err = redis.ErrClosed
		close(cs.ready)
		h.mu.Unlock()
		return
	}
	h.loops.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.loops.Done()
		ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
		defer cancel()
		s.subscribe(ctx, cs)
	}()
}
