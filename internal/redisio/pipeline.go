// This file sends a round of commands in one pipeline; on a cluster, one
// pipeline per master, following MOVED and ASK.

package redisio

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxRedirects bounds how often one round follows MOVED and ASK.
const maxRedirects = 3

// Pipeline sends cmds in one round; keys[i] is a key of cmds[i], all of
// whose keys are in one slot. Each command gets its reply or error.
//
// On a cluster it does not use ClusterClient.Pipelined: that races with
// itself (two goroutines write one command's reply) when a node's part
// meets TRYAGAIN on one command and ASK on another while a slot migrates
// (see RELIABILITY.md). Instead each master's commands go through its own
// client in one pipeline, the masters concurrently, and MOVED and ASK are
// followed here, up to maxRedirects times; TRYAGAIN, and a redirect to a
// node the client does not know yet, are left in the command for the
// caller to wait out as it does every transient error. Hooks added to the
// ClusterClient itself do not see these pipelines; hooks added to its nodes
// (OnNewNode) do.
func (cl *Client) Pipeline(ctx context.Context, keys []string, cmds []redis.Cmder) {
	cl.pipeline(ctx, keys, cmds, nil)
}

// Reads is Pipeline for a round of reads, sent through the tracked readers
// where there are (see TrackReads): tracked[i] says whether cmds[i] was.
func (cl *Client) Reads(ctx context.Context, keys []string, cmds []redis.Cmder) (tracked []bool) {
	tracked = make([]bool, len(cmds))
	cl.pipeline(ctx, keys, cmds, tracked)
	return tracked
}

// pipeline is Pipeline; with tracked non-nil, through the tracked readers.
func (cl *Client) pipeline(ctx context.Context, keys []string, cmds []redis.Cmder, tracked []bool) {
	if cl.cluster == nil {
		var rdb redis.Cmdable = cl.rdb
		if cl.reads.server != nil {
			rdb = cl.reads.server
		}
		all := make([]int, len(cmds))
		for i := range all {
			all[i] = i
		}
		sendVia(ctx, rdb, cmds, all, tracked, cl.reads.route, nil)
		return
	}
	r := &clusterRound{cc: cl.cluster, cmds: cmds, asking: make([]bool, len(cmds)), tracked: tracked, route: cl.reads.route}
	var pending []int
	r.to, pending = toMasters(ctx, r.cc, keys, func(i int, err error) { cmds[i].SetErr(err) })
	for hop := 0; len(pending) > 0; hop++ {
		sendPerNode(pending, r.to, func(node *redis.Client, idx []int) { r.send(ctx, node, idx) })
		if hop == maxRedirects {
			return // what is still redirected is a transient error for the callers
		}
		pending = r.redirected(ctx, pending)
	}
}

// clusterRound is one Pipeline on a cluster: where each command goes next.
type clusterRound struct {
	cc     *redis.ClusterClient
	cmds   []redis.Cmder
	to     []*redis.Client          // to[i]: the node cmds[i] goes to
	asking []bool                   // asking[i]: cmds[i] follows an ASK; ASKING goes before it
	nodes  map[string]*redis.Client // cc's nodes by address, for redirects; filled on the first

	tracked []bool // non-nil: reads, through the tracked readers; tracked[i]: cmds[i] went through one
	route   func(*redis.Client) (*redis.Client, bool)
}

// redirected points the commands of pending that met MOVED or ASK at the
// node the reply names, and returns them.
func (r *clusterRound) redirected(ctx context.Context, pending []int) (again []int) {
	for _, i := range pending {
		err := r.cmds[i].Err()
		moved := redis.HasErrorPrefix(err, "MOVED")
		if !moved && !redis.HasErrorPrefix(err, "ASK") {
			continue
		}
		if moved {
			r.cc.ReloadState(ctx)
		}
		if r.nodes == nil {
			r.nodes = clusterNodes(ctx, r.cc)
		}
		f := strings.Fields(err.Error()) // MOVED|ASK slot host:port
		if len(f) < 3 || r.nodes[f[2]] == nil {
			continue // a node this client does not know yet: the callers retry
		}
		r.to[i], r.asking[i] = r.nodes[f[2]], !moved
		again = append(again, i)
	}
	return again
}

// send sends cmds[idx] to node in one pipeline, each command with asking
// set preceded by ASKING (which holds for the next command only).
func (r *clusterRound) send(ctx context.Context, node *redis.Client, idx []int) {
	sendVia(ctx, node, r.cmds, idx, r.tracked, r.route, r.asking)
}

// sendVia sends cmds[idx] to node in one pipeline, each command whose
// asking is set (asking may be nil) preceded by ASKING, which holds for the
// next command only. With tracked non-nil the commands are reads, sent
// through node's tracked reader where route gives one (see throughReader);
// tracked[i] says whether cmds[i] went through one on this hop.
func sendVia(ctx context.Context, node redis.Cmdable, cmds []redis.Cmder, idx []int, tracked []bool, route func(*redis.Client) (*redis.Client, bool), asking []bool) {
	c, ok := node.(*redis.Client)
	if !ok || tracked == nil {
		sendPipeline(ctx, node, cmds, idx, asking)
		return
	}
	viaReader := throughReader(c, route,
		func(n *redis.Client) { sendPipeline(ctx, n, cmds, idx, asking) },
		func() bool { return anyCmdFailed(cmds, idx) },
		func() {
			for _, i := range idx {
				cmds[i].SetErr(nil)
			}
		})
	for _, i := range idx {
		tracked[i] = viaReader
	}
}

// sendPipeline sends cmds[idx] to node in one pipeline (see sendVia).
func sendPipeline(ctx context.Context, node redis.Cmdable, cmds []redis.Cmder, idx []int, asking []bool) {
	sent := make([]redis.Cmder, 0, len(idx))
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range idx {
			if asking != nil && asking[i] {
				_ = p.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
			}
			_ = p.Process(ctx, cmds[i])
			sent = append(sent, cmds[i])
		}
		return nil
	})
	unsent(sent, err)
}

// anyCmdFailed reports whether one of cmds[idx] failed (see readerFailed).
func anyCmdFailed(cmds []redis.Cmder, idx []int) bool {
	for _, i := range idx {
		if readerFailed(cmds[i].Err()) {
			return true
		}
	}
	return false
}

// unsent gives err, the error of a pipeline, to its commands that got no
// reply: a pipeline that could not be sent may leave its commands
// untouched.
func unsent(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, cmd := range cmds {
		switch cmd := cmd.(type) {
		case *redis.Cmd:
			if cmd.Err() == nil && cmd.Val() == nil {
				cmd.SetErr(err)
			}
		case *redis.StringCmd:
			if cmd.Err() == nil && cmd.Val() == "" {
				cmd.SetErr(err)
			}
		}
	}
}

// clusterNodes returns the clients of cc's nodes by address.
func clusterNodes(ctx context.Context, cc *redis.ClusterClient) map[string]*redis.Client {
	var mu sync.Mutex
	nodes := map[string]*redis.Client{}
	_ = cc.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes[node.Options().Addr] = node
		return nil
	})
	return nodes
}
