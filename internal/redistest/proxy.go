// This file is a TCP proxy in front of a Redis that can hold back what the server sends on one connection.

package redistest

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Proxy forwards every connection accepted at Addr to a Redis until the
// test ends. [Proxy.Hold] stalls one direction of one connection, as a
// network that stops delivering it would, while the others still flow: a
// process whose client answers but whose subscriber hears nothing.
type Proxy struct {
	Addr     string
	upstream string
	l        net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	links  map[string]*link // by the address the server sees (CLIENT LIST's addr=)
	closed bool
}

// link is one proxied connection.
type link struct {
	down, up net.Conn
	mu       sync.Mutex
	cond     *sync.Cond
	held     bool // what the server sends waits; protected by mu
	closed   bool // the proxy closed: nothing waits any more; protected by mu
}

// NewProxy starts a proxy to the Redis at upstream on a free loopback port.
func NewProxy(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	return ProxyAt(tb, "127.0.0.1:0", upstream)
}

// ProxyAt starts a proxy to the Redis at upstream that listens at addr: a
// Redis that comes back at the address its clients know.
func ProxyAt(tb testing.TB, addr, upstream string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("proxy: %v", err)
	}
	p := &Proxy{Addr: l.Addr().String(), upstream: upstream, l: l, links: map[string]*link{}}
	tb.Cleanup(p.close)
	p.wg.Go(p.accept)
	return p
}

func (p *Proxy) accept() {
	for {
		down, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		k := &link{down: down, up: up}
		k.cond = sync.NewCond(&k.mu)
		p.mu.Lock()
		if p.closed { // accepted as the test ended: nobody would close them
			p.mu.Unlock()
			_ = down.Close()
			_ = up.Close()
			return
		}
		p.links[up.LocalAddr().String()] = k
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(up, down); _ = up.Close() })
		p.wg.Go(k.replies)
	}
}

// replies forwards what the server sends, waiting while the link is held;
// the server's close waits too, so that a held connection looks alive.
func (k *link) replies() {
	buf := make([]byte, 32<<10)
	for {
		n, err := k.up.Read(buf)
		if n > 0 {
			k.wait()
			if _, werr := k.down.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	k.wait()
	_ = k.down.Close()
}

func (k *link) wait() {
	k.mu.Lock()
	for k.held && !k.closed {
		k.cond.Wait()
	}
	k.mu.Unlock()
}

func (k *link) hold(on bool) {
	k.mu.Lock()
	k.held = on
	k.mu.Unlock()
	k.cond.Broadcast()
}

// Hold holds back what the server sends on the proxied connection whose
// CLIENT ID is id (admin, a client of the same server, looks it up) until
// the returned release is called; requests still reach the server. A
// reply already on its way may still arrive.
func (p *Proxy) Hold(tb testing.TB, admin *redis.Client, id int64) (release func()) {
	tb.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		tb.Fatalf("proxy: CLIENT LIST: %v", err)
	}
	var addr string
	for line := range strings.SplitSeq(list, "\n") {
		if strings.HasPrefix(line, "id="+strconv.FormatInt(id, 10)+" ") {
			_, rest, _ := strings.Cut(line, " addr=")
			addr, _, _ = strings.Cut(rest, " ")
		}
	}
	p.mu.Lock()
	k := p.links[addr]
	p.mu.Unlock()
	if k == nil {
		tb.Fatalf("proxy: no proxied connection has CLIENT ID %d (addr %q)", id, addr)
	}
	k.hold(true)
	return func() { k.hold(false) }
}

func (p *Proxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	p.closed = true
	for _, k := range p.links {
		k.mu.Lock()
		k.closed = true
		k.mu.Unlock()
		k.cond.Broadcast()
		_ = k.down.Close()
		_ = k.up.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
