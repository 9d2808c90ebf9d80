// Package redisio sends a cache's commands to Redis: single reads coalesced
// into MGETs, rounds of commands in one pipeline
// and rounds of scripts run by hash.
//
// On a cluster, reads and rounds go to each key's master through that
// master's own client, never through ClusterClient.Pipelined,
// which races with itself while a slot migrates (RELIABILITY.md), and never
// to a replica, which may still hold a value that a Delete removed.
package redisio

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Client sends a cache's commands through a go-redis client. It is safe for
// concurrent use.
type Client struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // non-nil: rdb is a cluster client; rounds go to masters through their own clients
	reads   coalescer
}

// New returns a Client that sends through rdb, a *redis.Client,
// *redis.ClusterClient, *redis.Ring or failover client. batchContext gives
// each batch of coalesced reads its context: a batch serves several
// callers, so no caller's ctx may end it. replicaReads leaves a cluster
// client's reads (not its rounds) to the client's own routing, one GET per
// read.
func New(rdb redis.UniversalClient, batchContext func() context.Context, replicaReads bool) *Client {
	cl := &Client{rdb: rdb, reads: coalescer{rdb: rdb, batchContext: batchContext}}
	switch r := rdb.(type) {
	case *redis.Client:
		cl.reads.server = r
	case *redis.ClusterClient:
		cl.cluster = r
		if !replicaReads {
			cl.reads.masters = r
		}
	}
	return cl
}

// Get reads key, together with the reads of other callers that arrive
// while one is on the wire. It returns the bytes, redis.Nil when there are
// none (or a value of another type), or the read's error; ctx.Err() when
// ctx ends first. On a cluster a slot's MOVED, ASK or TRYAGAIN is returned
// to its readers, not followed.
func (cl *Client) Get(ctx context.Context, key string) ([]byte, error) {
	rep := cl.reads.get(ctx, key, nil, false)
	return rep.Val, rep.Err
}

// Reply is a read's outcome.
type Reply struct {
	Val     []byte // the bytes; nil with Err redis.Nil when there are none
	Extra   []any  // the replies of the keys read with it (see Read)
	Tracked bool   // Val was read through a tracked reader (see TrackReads)
	Err     error
}

// Read is Get, with the replies of extra read in the same MGET on a single
// server (see GetWith), and whether the read went through a tracked
// reader.
func (cl *Client) Read(ctx context.Context, key string, extra []string) Reply {
	return cl.read(ctx, key, extra, false)
}

// ReadDetached is Read, sent on a batch's context even when nothing else
// is on the wire, so that a caller who leaves when ctx ends does not cut
// the read short: go-redis closes a connection whose read a deadline cut,
// and the close of a tracked reader's connection drops the near cache.
func (cl *Client) ReadDetached(ctx context.Context, key string, extra []string) Reply {
	return cl.read(ctx, key, extra, true)
}

// read is Read, or with detached ReadDetached.
func (cl *Client) read(ctx context.Context, key string, extra []string, detached bool) Reply {
	if len(extra) > 0 && cl.reads.server == nil {
		return Reply{Err: errors.New("cache: redis: a read with other keys needs a single-server client")}
	}
	return cl.reads.get(ctx, key, extra, detached)
}

// TrackReads sends the reads of Read and Reads through via(node), node's
// tracked reader (whose reads Redis reports the writes of to a per-key
// near cache), where via returns one; elsewhere through node, untracked.
// Called before any read.
func (cl *Client) TrackReads(via func(node *redis.Client) *redis.Client) {
	cl.reads.via = via
}

// GetWith is Get with other keys read in the same MGET, their raw
// replies (nil where a key has no string) in order. Single-server clients
// only: elsewhere the keys may lie in other slots.
func (cl *Client) GetWith(ctx context.Context, key string, extra []string) ([]byte, []any, error) {
	rep := cl.Read(ctx, key, extra)
	return rep.Val, rep.Extra, rep.Err
}

// MGetSlot reads keys, all of one slot, with one MGET: on a cluster from
// their master, whatever the client's routing of reads (a replica may
// still hold what a write replaced). Replies are nil where a key has no
// string.
func (cl *Client) MGetSlot(ctx context.Context, keys []string) ([]any, error) {
	if cl.cluster == nil {
		return cl.rdb.MGet(ctx, keys...).Result()
	}
	args := make([]any, 0, len(keys)+1)
	args = append(args, "mget")
	for _, k := range keys {
		args = append(args, k)
	}
	cmd := redis.NewSliceCmd(ctx, args...)
	cl.Pipeline(ctx, keys[:1], []redis.Cmder{cmd})
	return cmd.Result()
}

// Queued returns the number of reads waiting for the next batch; tests use
// it to know that a read has joined one.
func (cl *Client) Queued() int {
	cl.reads.mu.Lock()
	defer cl.reads.mu.Unlock()
	return len(cl.reads.queue)
}
