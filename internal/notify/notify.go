// Package notify wakes the waiters for a key's load lock when its holder
// commits or releases, instead of leaving them to their poll interval: the
// cache's scripts publish the key on a channel of its cluster slot named
// under the cache's prefix (see [Channel]), and the caches on one client
// share one subscription per Redis master.
package notify

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// RetryAfter is how long waits on a master (or a channel) whose
// subscription failed only poll before subscribing again: a broken server
// costs one attempt per RetryAfter, not one per wait.
const RetryAfter = time.Second

// idleAfter is how long a subscription stays open without a waiter before
// it is closed, with its connection and its goroutine.
const idleAfter = 30 * time.Second

// Notifier delivers the announcements to waiters. It subscribes lazily, on
// the first wait for a channel, with one PubSub (one connection and one
// goroutine) per Redis master: SSUBSCRIBE, or SUBSCRIBE on a server that
// does not know it (Redis < 7, where the scripts PUBLISH instead of
// SPUBLISH: both follow from the server's version). A subscription with no
// waiter for idleAfter is closed; so are all of them by Close, and a
// subscription's goroutine also ends when its connection fails (closing the
// Redis client closes it). A connection that fails silently is found by a
// PING after a wait ran out (see probe). A broken subscription is replaced
// by a later wait, RetryAfter after it broke.
//
// A nil *Notifier (a client it cannot subscribe on, such as a redis.Ring or
// another UniversalClient than *redis.Client and *redis.ClusterClient) only
// sleeps: its waiters poll. So do waits whose subscription failed or is not
// confirmed in time: a lost message, a reconnect or a slot moving away costs
// at most one backoff, never a hang. Safe for concurrent use.
//
// Each cache holds a Notifier of its own prefix (which names its channels,
// see [Channel]) over the subscriber of its client: caches with other prefixes
// subscribe other channels on the same subscriptions, and a message wakes
// the waits for its key, whichever channel brought it.
type Notifier struct {
	*subscriber
	prefix string
}

// New returns a Notifier of rdb's subscriptions for the empty prefix (see
// [Notifier.WithPrefix] for others), or nil if it cannot subscribe on rdb
// (then its waiters poll). No I/O: it subscribes on the first wait.
func New(rdb redis.UniversalClient) *Notifier {
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		return &Notifier{subscriber: &subscriber{rdb: c, timeout: subscribeTimeout(o.DialTimeout, o.WriteTimeout)}}
	case *redis.ClusterClient:
		o := c.Options()
		return &Notifier{subscriber: &subscriber{rdb: c, cluster: c, timeout: subscribeTimeout(o.DialTimeout, o.WriteTimeout)}}
	}
	return nil
}

// WithPrefix returns a Notifier for the channels of a cache with prefix p,
// sharing n's subscriptions; nil if n is nil.
func (n *Notifier) WithPrefix(p string) *Notifier {
	if n == nil {
		return nil
	}
	return &Notifier{subscriber: n.subscriber, prefix: p}
}

// Channel is what the scripts publish on for key; "" when nobody listens
// (n is nil).
func (n *Notifier) Channel(key string) string {
	if n == nil {
		return ""
	}
	return Channel(n.prefix, key)
}

// Wait blocks until the lock of key is committed or released (true), d
// passes or ctx ends (false). The first wait for a channel subscribes to it
// and returns false as soon as the server confirms, so that the caller
// re-reads: a commit published before the subscription is not missed.
func (n *Notifier) Wait(ctx context.Context, key string, d time.Duration) bool {
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

// Close ends the subscriptions of every prefix and waits for their
// goroutines. Later waits poll. Safe to call more than once, concurrently,
// and on a nil *Notifier.
func (n *Notifier) Close() {
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
