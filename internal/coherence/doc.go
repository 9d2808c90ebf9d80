// This file tells what the package promises and how the tracker keeps it.

// Package coherence keeps a near cache (values in process memory) strictly
// coherent with Redis: a read that begins after a write of its key returned,
// in any process, never gets the old value from memory. The near cache asks
// a [Tracker] for three things: whether memory may be served at all
// ([Tracker.Serving]), whether a reply read from Redis may be kept
// ([Tracker.Ticket], [Tracker.Valid]), and, for its own writes, to announce
// them and wait for the other processes ([Tracker.Write]). The tracker
// removes values from memory through [Hooks.OnDrop].
//
// # Invalidations
//
// On every master (or Ring shard) a private RESP2 connection asks Redis for
// client-side caching invalidations in broadcast mode (CLIENT TRACKING ON
// REDIRECT <itself> BCAST PREFIX <p1> PREFIX <p2> ...) and listens on
// __redis__:invalidate. Redis then reports every write of a key under the
// prefixes, by any client (this library, another program, redis-cli, an
// expiry or an eviction), so the key is dropped from memory in every
// process that holds it. The connections belong to a [Hub], one per Redis
// client, shared by the trackers of every near cache on it: each hears the
// invalidations under its own prefix.
//
// A process is sure of its invalidations only while every such connection
// is subscribed; whenever one is lost, reconnects, or the set of masters
// changes, the whole near cache is dropped and memory is not served until
// the connections are back. Reads begun before a drop or an invalidation of
// their key are not kept (see [Ticket]): the race between a read's reply and
// the invalidation of its key cannot leave an old value in memory.
//
// # Leases
//
// Invalidations alone are eventually coherent: Redis sends them without
// waiting for the other clients, so a write could return before another
// process dropped the old value. As in Chubby's cache leases (Burrows, OSDI
// 2006, section 2.5), a process serves memory only while it holds a
// coherence lease, and a lease is renewed only by proving, on every tracking
// connection, that the invalidations Redis sent before the renewal have
// arrived. Writers wait for each live holder's acknowledgement of
// their write or for the end of its lease, so a process that
// stops hearing Redis (frozen, partitioned, its subscription killed) stops
// serving memory before any writer gives up on it.
//
// # Markers and acknowledgements
//
// After its write, a writer announces it with a marker (its id and the
// write's number) that reaches every holder after the write's invalidation,
// on every tracking connection. A holder that has seen the marker on all of
// them has dropped the old value, and says so on the writer's
// acknowledgement channel. The writer waits for the acknowledgement
// of every holder whose lease runs, each at most until its lease ends by the
// server's clock: a frozen process costs a write at most one lease, never an
// error. An acknowledgement lost on the way (published before the writer's
// own subscription was confirmed, or across a reconnect) is asked for again:
// the marker is published again, after the write like the first. A registry
// created within a lease (first use, or lost to a flush, an eviction or a
// restart) may have forgotten leases that still run: a write then also waits
// until one lease has passed since its creation.
//
// # Writers without a near cache
//
// A process that writes without a near cache ([NewWriter]) announces and
// confirms its writes the same way, so that processes configured
// differently keep the promise. It holds no lease (it serves nothing, so
// no writer waits for it) and has no tracking connection; its
// acknowledgements come on a subscription of its own, opened by the first
// write that finds a holder to wait for (a write on a prefix nobody holds
// costs only the registry's reply), kept while writes come and closed
// some leases after the last. A write begun before that subscription was
// confirmed publishes its marker again once it is.
//
// # Eventual near caches
//
// A near cache that chose eventual coherence ([NewEventual]) tracks
// invalidations like any other but holds no lease and acknowledges
// nothing: writers never wait for it, and it serves memory while it is sure
// of its connections, old for as long as an invalidation takes to arrive
// (bounded by the near cache's max age if one is lost unnoticed). Its own
// writes confirm like a writer's without a near cache, so the holders of a
// prefix keep their promise whoever writes; on a prefix where every process
// is eventual there is no holder, and writes wait for nobody.
//
// On a single server or a cluster an eventual near cache tracks per key
// ([Hub.NewPerKey]): its reads go through a reader per node, whose
// connections have Redis remember the keys they read and send their
// invalidations to the node's subscribed connection, so a write is reported
// only to the processes that read its key. Only replies read there are
// kept; a reader follows its subscribed connection when that one is
// replaced; a reader connection that closes drops memory, since what it
// read is tracked no more.
//
// # Per-key holders
//
// A strict near cache may track per key too ([Hub.NewHolder]): it reads
// through the readers, and a read it may keep first registers it, in the
// same pipeline, as a holder of the key ([HoldersKey]). A write reads its
// keys' holders after it ran (confirm_keys.lua), announces itself on each
// one's own channel and waits for those alone, each at most until its
// lease ends, which it holds in [HoldRegistryKey]; a write of a key nobody
// holds waits for nobody. Writes of the keys every holder tracks (tag and
// Clear versions), and every write while holders that track by prefix
// lease in [RegistryKey] (earlier versions, a Ring's), wait for everyone,
// as before; per-key holders lease there too while it exists.
package coherence
