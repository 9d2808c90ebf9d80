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
	if cl.cluster == nil {
		_, err := cl.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				_ = p.Process(ctx, cmd)
			}
			return nil
		})
		unsent(cmds, err)
		return
	}
	r := &clusterRound{cc: cl.cluster, cmds: cmds, asking: make([]bool, len(cmds))}
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
	sent := make([]redis.Cmder, 0, len(idx))
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range idx {
			if r.asking[i] {
				_ = p.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
			}
			_ = p.Process(ctx, r.cmds[i])
			sent = append(sent, r.cmds[i])
		}
		return nil
	})
	unsent(sent, err)
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
