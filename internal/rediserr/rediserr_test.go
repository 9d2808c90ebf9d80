package rediserr

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestClassify sorts real error replies, made by the server.
func TestClassify(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	reply := func(msg string) error {
		err := rdb.Eval(t.Context(), "return redis.error_reply(ARGV[1])", nil, msg).Err()
		require.Error(t, err)
		require.Equal(t, msg, err.Error())
		return err
	}
	for msg, want := range map[string][2]Class{ // on a cluster client, on a plain one
		"TRYAGAIN Multiple keys request during rehashing of slot": {Transient, Fatal},
		"MOVED 3999 127.0.0.1:6381":                               {Transient, Fatal},
		"ASK 3999 127.0.0.1:6381":                                 {Transient, Fatal},
		"CLUSTERDOWN The cluster is down":                         {Transient, Fatal},
		"LOADING Redis is loading the dataset in memory":          {Transient, Transient},
		"READONLY You can't write against a read only replica.":   {Transient, Transient},
		"OOM command not allowed when used memory > 'maxmemory'.": {Full, Full},
		"ERR Error running script (call to f_d6df878c0b97e6a3834bf06df9fa5d785a54b81c): @user_script:19: @user_script: 19: -OOM command not allowed when used memory > 'maxmemory'.": {Full, Full}, // Redis 6.2
		"NOAUTH Authentication required.":                                  {Fatal, Fatal},
		"WRONGPASS invalid username-password pair":                         {Fatal, Fatal},
		"NOPERM this user has no permissions to run the 'evalsha' command": {Fatal, Fatal},
		"ERR unknown command 'EVALSHA'":                                    {Fatal, Fatal},
	} {
		err := reply(msg)
		if got := Classify(err, true); got != want[0] {
			t.Errorf("Classify(%q, cluster) = %d; want %d", msg, got, want[0])
		}
		if got := Classify(err, false); got != want[1] {
			t.Errorf("Classify(%q, plain) = %d; want %d", msg, got, want[1])
		}
		assert.True(t, IsReply(err))
	}
	assert.Equal(t, None, Classify(redis.Nil, false))
	assert.Equal(t, Outage, Classify(context.DeadlineExceeded, false))
	assert.Equal(t, Outage, Classify(errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), false))
	assert.False(t, IsReply(errors.New("dial tcp 127.0.0.1:1: connect: connection refused")))
}
