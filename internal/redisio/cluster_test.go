// This file tests reads and rounds on a real cluster of one master:
// keys of many slots go to the master together, each with its own reply.

package redisio

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/slot"
)

// newOneMasterCluster starts a cluster of one master that serves every
// slot and returns a cluster client whose node clients carry gate.
func newOneMasterCluster(t *testing.T, gate *redistest.ReadGate) *redis.ClusterClient {
	t.Helper()
	srv := redistest.PrivateServer(t, "it needs a cluster-enabled Redis",
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	admin := redistest.Client(t, srv.Addr)
	slots := make([]int, slot.Count)
	for i := range slots {
		slots[i] = i
	}
	require.NoError(t, admin.ClusterAddSlots(t.Context(), slots...).Err())
	require.Eventually(t, func() bool {
		return strings.Contains(admin.ClusterInfo(t.Context()).Val(), "cluster_state:ok")
	}, 20*time.Second, 10*time.Millisecond, "cluster state ok")
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{srv.Addr},
		NewClient: func(opt *redis.Options) *redis.Client {
			node := redis.NewClient(opt)
			node.AddHook(gate) // before the node client is in use
			return node
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func TestClusterReadsAndRounds(t *testing.T) {
	gate := redistest.NewReadGate()
	cc := newOneMasterCluster(t, gate)
	cl := New(cc, t.Context, false)
	var keys []string
	for i := range 20 { // 20 slots, two keys in each
		keys = append(keys, "{s"+strconv.Itoa(i)+"}a", "{s"+strconv.Itoa(i)+"}b")
	}
	for _, k := range keys {
		require.NoError(t, cc.Set(t.Context(), k, "v"+k, 0).Err())
	}

	got, errs := make([][]byte, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = cl.Get(t.Context(), "lead") })
	gate.Next(t)
	for i, k := range keys {
		wg.Go(func() { got[i], errs[i] = cl.Get(t.Context(), k) })
	}
	queued(t, cl, len(keys))
	gate.Open()
	wg.Wait()
	for i, k := range keys {
		if assert.NoError(t, errs[i], "Get(%q)", k) {
			assert.Equal(t, "v"+k, string(got[i]), "Get(%q)", k)
		}
	}
	assert.Equal(t, 20, gate.Count("mget"), "MGETs: one per slot")
	assert.Equal(t, 1, gate.Pipelines(), "pipelines: one for the master")

	cmds := make([]redis.Cmder, len(keys))
	for i, k := range keys {
		cmds[i] = redis.NewStringCmd(t.Context(), "get", k)
	}
	cl.Pipeline(t.Context(), keys, cmds)
	for i, k := range keys {
		assert.Equal(t, "v"+k, cmds[i].(*redis.StringCmd).Val(), "GET %s in a round", k)
	}
	assert.Equal(t, 2, gate.Pipelines(), "pipelines: the round's one for the master")
}
