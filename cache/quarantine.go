// This file is the quarantine of keys whose records the codec cannot
// decode: the value last loaded for such a key is served for a while
// instead of a load on every read.

package cache

import (
	"bytes"
	"container/list"
	"sync"
	"sync/atomic"
	"time"
)

// The quarantine's bounds: its first interval, the longest (never past the
// Cache's TTL either), and how many keys it remembers.
const (
	quarantineFirst = 100 * time.Millisecond
	quarantineLimit = 5 * time.Second
	quarantineKeys  = 1024
)

// quarantine remembers, for each key whose record the codec could not
// decode (another value type, an older V, another program writing the
// key), the value this process loaded for it last. Without it, a key that
// another program keeps rewriting costs a load per read: every read finds
// a record it cannot use, and each load's commit is overwritten again.
//
// A read that finds such a record loads the key once its interval is over
// (the load overwrites the record, as any miss does), and is answered with
// that load's value within it; the interval starts at quarantineFirst and
// doubles with each load, up to quarantineLimit and the TTL. The values
// are never kept in the near cache nor counted as hits (EventQuarantined).
// A key's quarantine ends when a read decodes a record at the key other
// than the one this process loaded last (its own commit, read back), when
// this process writes the key (Set, Delete, Expire; DeleteByTag and Clear
// end every quarantine), and for the key loaded longest ago once
// quarantineKeys keys are in. Safe for concurrent use.
type quarantine[V any] struct {
	first, limit time.Duration // read-only after newQuarantine (tests shorten or stretch them)
	n            atomic.Int64  // len(keys): the read path skips an empty quarantine without a lock

	mu    sync.RWMutex
	keys  map[string]*list.Element // of *quarantined[V]; protected by mu
	order list.List                // loaded longest ago first; protected by mu
}

// quarantined is one key's quarantine.
type quarantined[V any] struct {
	key      string
	kept     *result[V]    // the value last loaded (data, not-found, or an unencoded v); nil: none yet
	interval time.Duration // how long kept is served after the lock of its load was taken
	until    time.Time
	// due is when a read found the interval over (zero: it is not): the
	// next load whose lock was taken after it is kept. A load that began
	// before a write that ended an earlier quarantine is thus never kept.
	due time.Time
}

func newQuarantine[V any](ttl time.Duration) *quarantine[V] {
	return &quarantine[V]{first: min(quarantineFirst, ttl), limit: min(quarantineLimit, ttl), keys: map[string]*list.Element{}}
}

// held is what a read sent at at, which found at key a record the codec
// could not decode, is answered with: the value last loaded while the
// key's interval lasts; otherwise nil, a miss, whose load is then kept.
func (q *quarantine[V]) held(key string, at time.Time) *result[V] {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entry(key)
	if e.kept != nil && at.Before(e.until) {
		return e.kept.copyAt(at)
	}
	if e.due.IsZero() {
		e.due = at
	}
	return nil
}

// entry returns key's quarantine, starting one if there is none; mu held.
func (q *quarantine[V]) entry(key string) *quarantined[V] {
	if el, ok := q.keys[key]; ok {
		return el.Value.(*quarantined[V])
	}
	if len(q.keys) >= quarantineKeys {
		q.remove(q.order.Front())
	}
	e := &quarantined[V]{key: key}
	q.keys[key] = q.order.PushBack(e)
	q.n.Store(int64(len(q.keys)))
	return e
}

// loaded keeps r, loaded for key under a lock taken at locked, if key's
// quarantine is due for it, and starts the next interval.
func (q *quarantine[V]) loaded(key string, r *result[V], locked time.Time) {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	el, ok := q.keys[key]
	if !ok {
		return
	}
	e := el.Value.(*quarantined[V])
	if e.due.IsZero() || locked.Before(e.due) {
		return
	}
	e.kept, e.due = r.copyAt(time.Time{}), time.Time{}
	e.interval = min(max(2*e.interval, q.first), q.limit)
	e.until = locked.Add(e.interval)
	q.order.MoveToBack(el)
}

// decoded ends key's quarantine, if any, unless payload, the bytes of a
// value decoded at key, is the value this process loaded last.
func (q *quarantine[V]) decoded(key string, payload []byte) {
	if q.n.Load() == 0 {
		return
	}
	q.mu.RLock()
	el, ok := q.keys[key]
	own := ok && el.Value.(*quarantined[V]).loadedLast(payload)
	q.mu.RUnlock()
	if !ok || own {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if cur, ok := q.keys[key]; ok && !cur.Value.(*quarantined[V]).loadedLast(payload) {
		q.remove(cur)
	}
}

// loadedLast reports whether payload is the value e keeps; mu held.
func (e *quarantined[V]) loadedLast(payload []byte) bool {
	return e.kept != nil && e.kept.notFound == nil && !e.kept.unencoded && bytes.Equal(e.kept.data, payload)
}

// forget ends the quarantine of keys: this process wrote them.
func (q *quarantine[V]) forget(keys ...string) {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		if el, ok := q.keys[k]; ok {
			q.remove(el)
		}
	}
}

// clear ends every quarantine: a DeleteByTag or Clear may have removed
// any value kept.
func (q *quarantine[V]) clear() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.keys)
	q.order.Init()
	q.n.Store(0)
}

// remove ends the quarantine el holds; mu held.
func (q *quarantine[V]) remove(el *list.Element) {
	delete(q.keys, q.order.Remove(el).(*quarantined[V]).key)
	q.n.Store(int64(len(q.keys)))
}

// copyAt is a copy of r's answer (its value, or its not-found) for a flight
// whose read was sent at at, marked as served from the quarantine.
func (r *result[V]) copyAt(at time.Time) *result[V] {
	c := &result[V]{data: r.data, notFound: r.notFound, stamp: r.stamp, at: at, quarantined: true}
	if r.unencoded {
		c.v, c.hasV, c.unencoded = r.v, true, true
	}
	return c
}
