// replica.go is the option that lets hits be served by a cluster's
// replicas, trading read-after-Delete for spreading a hot key's reads.

package cache

// WithReplicaReads lets the reads of [Cache.GetOrLoad] and [Cache.Get]
// follow the Redis client's own routing: with a *redis.ClusterClient (or a
// failover cluster client) built with ReadOnly, RouteByLatency or
// RouteRandomly, hits are then served by replicas, one GET per read (no
// batching). Without it the cache reads from masters whatever the client's
// routing.
//
// The guarantee is weaker: a caller that begins after a [Cache.Delete] or
// [Cache.Set] returned may still get the old value (or miss a new one) for
// as long as the replica that serves it lags behind its master, which is
// usually milliseconds but has no bound (a replica that stops applying its
// master's stream serves its old copy until it resumes or is cut off;
// reliability/replica_test.go measures it). Misses, loads and writes go to
// masters as always, so a key is still loaded once. The near cache keeps
// nothing then (a replica's copy may be older than the invalidations the
// process has seen, and memory would keep it past the lag), but its process
// still waits for the others' near caches when it writes. Default: off. It
// changes nothing for a client that is not a cluster client.
func WithReplicaReads() Option { return func(c *config) { c.replicaReads = true } }
