// Per-key tracking: the read connections whose reads Redis remembers, and
// how a per-key near cache learns that it must forget them.

package coherence

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// reader is a client to one node whose every connection asks Redis to
// track the keys it reads and to send their invalidations to the node's
// subscribed connection (CLIENT TRACKING ON REDIRECT <sub>, default mode):
// Redis then reports a write of a key only to the processes that read it,
// where broadcast tracking reports it to every process of the prefix.
//
// What a connection read is tracked only while it lives: Redis skips a
// closed client when it invalidates, and nobody is told. So a reader's
// connections are never closed on purpose while it is current (no idle
// reaping, no lifetime), and a close, whatever its cause, drops the memory
// of every per-key tracker of the hub (see Hub.readerLost). A reader is
// bound to one subscribed connection: when that one is replaced, so is the
// reader (see Hub.bindReader).
type reader struct {
	client *redis.Client
	sub    int64 // the CLIENT ID its invalidations go to

	mu    sync.Mutex
	conns map[int64]bool // its connections' CLIENT IDs, for checkReaders; protected by mu
}

// readerGrace is how long a replaced reader stays open for the reads
// already sent through it; none of their replies is kept (the replacement
// voided them).
const readerGrace = 10 * time.Second

// bindReader gives n a reader that redirects to its current subscribed
// connection, and retires the one it had. Called when the invalidations'
// subscription is confirmed (h.tmu held for reading), before the trackers'
// reads in flight are voided: a read that takes its ticket after that void
// is sent through the new reader; and by register for the first per-key
// tracker of a node already subscribed (h.tmu and h.mu held).
func (h *Hub) bindReader(n *node, base *redis.Options) {
	select {
	case <-n.stopped: // (a confirmation that raced with the node's stop)
		return
	default:
	}
	r := &reader{sub: n.id.Load(), conns: map[int64]bool{}}
	opt := readerOptions(base)
	opt.OnConnect = readerOnConnect(r, base.OnConnect)
	opt.Dialer = closeNotifier(opt.Dialer, func() { h.readerLost(n.addr, r) })
	r.client = redis.NewClient(&opt)
	r.client.AddHook(registrar{h: h, client: func() *redis.Client { return r.client }})
	if old := h.setReader(n, r); old != nil {
		h.retire(old)
	}
}

// retire closes r after readerGrace, or when the hub closes if sooner.
func (h *Hub) retire(r *reader) {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	if h.closed.Load() {
		_ = r.client.Close()
		return
	}
	h.retired[r] = time.AfterFunc(readerGrace, func() {
		h.rmu.Lock()
		delete(h.retired, r)
		h.rmu.Unlock()
		_ = r.client.Close()
	})
}

// closeRetired closes the retired readers at once; the hub is closing.
func (h *Hub) closeRetired() {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	for r, timer := range h.retired {
		timer.Stop()
		_ = r.client.Close()
	}
	clear(h.retired)
}

// readerOptions are the options of a reader of base's node: its
// connection settings, and a pool that closes nothing by itself.
func readerOptions(base *redis.Options) redis.Options {
	opt := nodeOptions(base)
	opt.PoolSize = base.PoolSize
	opt.PoolFIFO = base.PoolFIFO
	opt.ConnMaxIdleTime = -1 // an idle connection closed would lose what it read
	opt.MaxRetries = -1      // a failed read falls back to the user's client, whose retries apply
	return opt
}

// readerOnConnect turns tracking on for a reader's connection, after the
// user's OnConnect, and notes its CLIENT ID.
func readerOnConnect(r *reader, user func(context.Context, *redis.Conn) error) func(context.Context, *redis.Conn) error {
	sub := r.sub
	return func(ctx context.Context, cn *redis.Conn) error {
		_ = cn.ClientSetName(ctx, ReaderName).Err() // an ACL may refuse it
		if user != nil {
			if err := user(ctx, cn); err != nil {
				return fmt.Errorf("near cache reader: OnConnect: %v", err) // not a reply: the read falls back
			}
		}
		cmd := redis.NewStatusCmd(ctx, "client", "tracking", "on", "redirect", sub)
		if err := cn.Process(ctx, cmd); err != nil {
			return fmt.Errorf("near cache reader: CLIENT TRACKING ON REDIRECT %d: %v", sub, err)
		}
		if id, err := cn.ClientID(ctx).Result(); err == nil {
			r.mu.Lock()
			r.conns[id] = true
			r.mu.Unlock()
		}
		return nil
	}
}

// checkReaders asks each node whether its reader's connections are all
// still there. One the server closed (CLIENT KILL, its idle timeout) is
// not seen by the client until it is next used, and what it read is no
// longer tracked: a connection missing from CLIENT LIST drops the memory
// of the per-key trackers, as a close seen by the client does. Called
// every checkEvery. A server without CLIENT LIST ID (before 6.2) or an
// ACL without it leaves such a close to be seen at the next use.
func (h *Hub) checkReaders(ctx context.Context) {
	m := h.readers.Load()
	if m == nil || !h.hasPerKey() {
		return
	}
	for addr, r := range *m {
		if r.missing(ctx) {
			h.readerLost(addr, r)
		}
	}
}

// missing reports whether a connection r noted is no longer on the
// server, and forgets those that are not.
func (r *reader) missing(ctx context.Context) bool {
	r.mu.Lock()
	args := []any{"client", "list", "id"}
	for id := range r.conns {
		args = append(args, id)
	}
	r.mu.Unlock()
	if len(args) == 3 {
		return false
	}
	list, err := r.client.Do(ctx, args...).Text()
	if err != nil {
		return false
	}
	live := map[int64]bool{}
	for _, line := range strings.Split(list, "\n") {
		if f, _, ok := strings.Cut(line, " "); ok {
			if id, err := strconv.ParseInt(strings.TrimPrefix(f, "id="), 10, 64); err == nil {
				live[id] = true
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	gone := false
	for _, a := range args[3:] {
		if id := a.(int64); !live[id] {
			delete(r.conns, id)
			gone = true
		}
	}
	return gone
}

// hasPerKey reports whether the hub has a per-key tracker.
func (h *Hub) hasPerKey() bool {
	for _, t := range h.state.Load().trackers {
		if t.perKey {
			return true
		}
	}
	return false
}

// ReaderName names the readers' connections in CLIENT LIST.
const ReaderName = "stampede-near-read"

// closeNotifier wraps dial so that closing any connection it made calls
// closed (once per connection).
func closeNotifier(dial func(ctx context.Context, network, addr string) (net.Conn, error), closed func()) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		nc := &notifyingConn{Conn: cn, closed: closed}
		if sc, ok := cn.(syscall.Conn); ok {
			return &notifyingSysConn{nc, sc}, nil
		}
		return nc, nil
	}
}

// notifyingSysConn is a notifyingConn over a connection with a file
// descriptor (TCP, Unix), which go-redis's pool checks when it hands the
// connection out: one the server closed is then replaced before use.
type notifyingSysConn struct {
	*notifyingConn
	sys syscall.Conn
}

func (c *notifyingSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

// notifyingConn is a reader's connection: its Close is reported.
type notifyingConn struct {
	net.Conn
	once   sync.Once
	closed func()
}

func (c *notifyingConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.closed)
	return err
}

// readerLost is told that a connection of r, the reader at addr, closed
// or is gone from the server: what it read is no longer tracked, so every
// per-key tracker drops its memory and voids its reads in flight. A reader
// that was replaced or stopped is ignored: its replacement voided
// everything already.
func (h *Hub) readerLost(addr string, r *reader) {
	if m := h.readers.Load(); m != nil && (*m)[addr] == r {
		h.dropPerKey()
	}
}

// dropPerKey drops the memory of every per-key tracker and voids its reads
// in flight.
func (h *Hub) dropPerKey() {
	for _, t := range h.state.Load().trackers {
		if t.perKey {
			t.dropAll(false)
		}
	}
}

// stopReader closes n's reader; its closes are ignored from here on.
func (h *Hub) stopReader(n *node) {
	if r := h.setReader(n, nil); r != nil {
		_ = r.client.Close()
	}
}

// setReader makes r n's reader (nil: none), and returns the one it
// replaces. Reads find readers by address without a lock (see
// Tracker.ReadVia), in a map replaced whole.
func (h *Hub) setReader(n *node, r *reader) (old *reader) {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	old = n.reader.Swap(r)
	m := map[string]*reader{}
	if cur := h.readers.Load(); cur != nil {
		maps.Copy(m, *cur)
	}
	switch {
	case r != nil:
		m[n.addr] = r
	case m[n.addr] == old: // not another node's, made since for the address
		delete(m, n.addr)
	}
	h.readers.Store(&m)
	return old
}

// ReadVia returns the reader of node (a client of the user's, to a master
// or a single server), through which a read is tracked for this tracker's
// per-key invalidations, or nil if node has none bound to its current
// subscribed connection: the read then goes through node, and its reply is
// not kept.
func (t *Tracker) ReadVia(node *redis.Client) *redis.Client {
	m := t.hub.readers.Load()
	if m == nil {
		return nil
	}
	r := (*m)[node.Options().Addr]
	if r == nil {
		return nil
	}
	return r.client
}
