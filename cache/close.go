// close.go ends what a Cache runs in the background.

package cache

// Close gives back the Cache's hold on what the caches on its Redis client
// share (see [New]): the last Cache on a client to close ends the client's
// subscriptions (see docs/PROTOCOL.md, notified waiters). Close then waits
// for the Cache's background refreshes to end; they are bounded by the load
// timeout. Calls made after Close still work, without background refreshes,
// and woken by notification only while another Cache on the client is
// open. Close is safe to call more than once and from several goroutines.
// It always returns nil.
func (c *Cache[V]) Close() error {
	c.share.release()
	c.bgMu.Lock()
	c.closed = true
	c.bgMu.Unlock()
	c.bg.Wait()
	if c.near != nil {
		c.near.close()
	}
	return nil
}
