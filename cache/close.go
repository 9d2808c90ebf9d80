// close.go ends what a Cache runs in the background.

package cache

// Close stops the Cache's subscriptions (see notified waiters in the package
// doc) and waits for its background refreshes to end; they are bounded by
// the load timeout. Calls made after Close still work, but without waking by
// notification and without background refreshes. Close is safe to call more
// than once and from several goroutines. It always returns nil.
func (c *Cache[V]) Close() error {
	c.notify.close()
	c.bgMu.Lock()
	c.closed = true
	c.bgMu.Unlock()
	c.bg.Wait()
	if c.near != nil {
		c.near.close()
	}
	return nil
}
