// This file gives the standalone lock its fencing token: a counter next to the
// lock key, incremented by the script that takes the lock, so that a store
// can refuse the writes of a holder whose lease was taken over.

package lock

import "github.com/stampede-go/stampede/internal/slot"

// fenceSuffix names the fencing counter of a lock key: see fenceKey.
const fenceSuffix = ":fence"

// fenceKey is the fencing counter of the lock at key (prefix included): in
// key's cluster slot, so that one script can take the lock and increment the
// counter, and starting with key (unless key has a stray '{'), so that an ACL
// key pattern that grants the lock grants its counter. Each lock key has a
// counter of its own (slot.Companion is one-to-one).
func fenceKey(key string) string { return slot.Companion(key, fenceSuffix) }

// Fence is the fencing token of this acquisition: a number that is larger for
// every later acquisition of the same key, by any process, so that the store
// the holder writes to can refuse the writes of a holder whose lease ran out
// and was taken over (Kleppmann, "How to do distributed locking", 2016).
//
// # What it is
//
// Next to the lock key lives a counter that never expires, at
// [Lock.FenceKey]: a name made from the lock key ("jobs:sku-1{T}:fence" for
// "jobs:sku-1", T chosen so that Redis Cluster puts both keys in one slot),
// which starts with the lock key unless that has an unmatched '{'. [Obtain]
// takes the lock and increments the counter in one Lua script, and Fence is
// the counter's value after that increment, so it is at least 1. If holder B
// obtained the key after holder A did, B.Fence() > A.Fence(). Refresh and
// Hold keep the fence. Fence asks no Redis and is safe for concurrent use.
//
// Obtaining again with [WithToken] while the token still holds the lock (a
// restarted process, a reply lost and the script resent) is an acquisition
// like any other and takes a new, larger fence: the fence names one
// acquisition, not one token, so writes still in flight under the earlier
// one (from a process that was thought dead) are refused once the new one
// has written.
//
// # How to use it
//
// Send the fence with every write to the store that the lock protects, and
// have the store keep, per record, the highest fence it accepted and refuse
// a lower one, in the same atomic step as the write:
//
//	UPDATE stock SET qty = $2, fence = $1 WHERE sku = $3 AND fence < $1
//
// No row updated means that a later holder has written: the lock is lost,
// stop. The strict "<" lets each acquisition write a record once (and
// refuses an equal fence); use "<=" for a holder that writes the same record
// several times. The check orders writes, not reads: a stale holder's write
// can still land between the new holder's read and write. Where that
// matters, have the new holder claim the record first (UPDATE ... SET fence
// = $1 WHERE fence < $1), then read, then write WHERE fence = $1. The store,
// not the lock, enforces all this; a fence no store checks protects nothing.
//
// # When it can fail
//
// The counter is only as durable as the Redis holding it. A restart without
// persistence (or with the last writes not yet fsynced), or a failover to a
// replica that had not copied the last acquisitions, can take the counter
// back: the next holders then get fences the store has already seen, and
// its check refuses their writes until the counter passes them again (safe,
// but it stalls; raise the counter at [Lock.FenceKey] by hand to recover).
// Nothing expires the counter, but an allkeys-* maxmemory-policy can evict
// it (use noeviction or a volatile-* policy, which evicts only keys with a
// TTL), and a DEL or a FLUSHDB resets it. Deleting the counter of a key no
// longer used is safe only when no store will see that key's fences again.
//
// # Quorum locks
//
// A lock from [ObtainQuorum] has no fence: Fence returns 0, and the quorum
// round increments no counter. A counter per master cannot give a number
// that grows across holders. Each master counts only the attempts that
// reached it, failed attempts included, so the counters drift apart, and two
// majorities share at least one master but not the one that holds the
// highest count. With five masters: attempts that reached only masters 1
// and 2, failed and were released, five times over, leave their counters at 5
// and the others at 0; holder A then takes masters 1, 2 and 3 (counts 6, 6,
// 1: fence 6); its lease runs out and B takes masters 3, 4 and 5 (counts 2,
// 1, 1: fence 2). Taking the maximum over the majority gave the
// newer holder the smaller fence, and the store would refuse B and accept
// A's stale writes, the opposite of fencing. A master restarted without
// persistence also starts again from 0, and Redlock tolerates that for the
// lock (after a delay) but not for a counter. Writing the maximum back to a
// majority before using it (a quorum register) needs a second round, counters
// that survive every restart, and the same timing assumptions as the lock;
// a number that only grows across independent nodes that fail is a
// consensus problem. Where fencing matters, take the fence from a consensus
// store (an etcd revision, a ZooKeeper zxid) or use [Obtain] on one Redis
// that does not lose writes.
//
// On a nil Lock, Fence returns 0.
func (l *Lock) Fence() int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// FenceKey is the Redis key of the lock's fencing counter (see [Lock.Fence]),
// for an operator who must raise it after a loss of data; "" on a quorum
// lock and on a nil Lock.
func (l *Lock) FenceKey() string {
	if l == nil {
		return ""
	}
	return l.fenceKey
}
