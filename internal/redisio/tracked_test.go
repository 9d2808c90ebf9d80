package redisio

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
)

// Reads go through the tracked reader that TrackReads gives, and say so; a
// reader that fails on the wire (here: nothing listens where it dials)
// costs the read nothing but its tracking: it is sent again through the
// user's client, and is not marked tracked, so a near cache does not keep
// it. Single reads, coalesced reads and pipelined rounds alike.
func TestReadsFallBackFromAFailingReader(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	p := redistest.Prefix(t, rdb)
	require.NoError(t, rdb.Set(t.Context(), p+"k", "v", 0).Err())
	good := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = good.Close() })
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })

	for _, tt := range []struct {
		name    string
		reader  *redis.Client
		tracked bool
	}{{"no reader", nil, false}, {"a reader", good, true}, {"a failing reader", dead, false}} {
		t.Run(tt.name, func(t *testing.T) {
			cl := New(rdb, context.Background, false)
			cl.TrackReads(func(*redis.Client) *redis.Client { return tt.reader })
			rep := cl.Read(t.Context(), p+"k", nil)
			require.NoError(t, rep.Err)
			assert.Equal(t, "v", string(rep.Val))
			assert.Equal(t, tt.tracked, rep.Tracked, "Read")

			cmd := redis.NewStringCmd(t.Context(), "get", p+"k")
			tracked := cl.Reads(t.Context(), []string{p + "k"}, []redis.Cmder{cmd})
			require.NoError(t, cmd.Err())
			assert.Equal(t, "v", cmd.Val())
			assert.Equal(t, []bool{tt.tracked}, tracked, "Reads")
		})
	}
}
