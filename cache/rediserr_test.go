// This file proves how the cache acts on Redis errors: transient
// cluster states are waited out and misconfiguration is returned
// under every policy.

package cache

import (
	"context"
	"errors"
	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/health"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// replyError returns a real error reply with text msg, made by the server.
func replyError(t *testing.T, rdb *redis.Client, msg string) error {
	t.Helper()
	err := rdb.Eval(t.Context(), "return redis.error_reply(ARGV[1])", nil, msg).Err()
	require.Error(t, err)
	require.Equal(t, msg, err.Error())
	return err
}

// TestTransientErrorsAreWaitedOut: while a slot migrates (TRYAGAIN, on a
// cluster client: see the reliability suite's real migration) or a server
// loads its data set, the lock script fails. It used to go to the failure
// policy: every instance loaded uncached. Now the flight waits and retries,
// so the key loads once and is stored.
func TestTransientErrorsAreWaitedOut(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	hook := redistest.FailCommands(redistest.IsScript, replyError(t, rdb, "LOADING Redis is loading the dataset in memory"), 3)
	rdb.AddHook(hook)
	var reported atomic.Int64
	c := New[product](rdb, WithRetry(10, 5e6), WithErrorHook(func(string, error) { reported.Add(1) }),
		WithoutNearCache()) // it counts scripts, and adds a hook to a client in use (a race on go-redis v9.5.5)
	src := &counter{}
	v, err := c.GetOrLoad(t.Context(), p+"k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID)
	assert.Equal(t, int64(3), hook.Seen())
	assert.Equal(t, int64(1), src.calls.Load())
	assert.Equal(t, int64(1), rdb.Exists(t.Context(), p+"k").Val(), "the value must be stored once the slot settles")
	assert.Zero(t, reported.Load(), "a wait is not a failure")

	t.Run("Delete", func(t *testing.T) {
		hook := redistest.FailCommands(redistest.Named("del"), replyError(t, rdb, "MASTERDOWN Link with MASTER is down"), 2)
		rdb.AddHook(hook)
		require.NoError(t, c.Delete(t.Context(), p+"k"))
		assert.Equal(t, int64(2), hook.Seen())
		assert.Zero(t, rdb.Exists(t.Context(), p+"k").Val())
	})
}

// TestClusterRepliesToAPlainClientAreReturned: a *redis.Client on one node
// of a cluster gets MOVED for other nodes' keys for ever; waiting it out
// would only delay the error by the load timeout.
func TestClusterRepliesToAPlainClientAreReturned(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	hook := redistest.FailCommands(redistest.Named("get"), replyError(t, rdb, "MOVED 3999 127.0.0.1:6381"), 1<<30)
	rdb.AddHook(hook)
	src := &counter{}
	_, err := New[product](rdb).GetOrLoad(t.Context(), p+"k", src.load)
	require.ErrorContains(t, err, "MOVED")
	assert.Equal(t, int64(1), hook.Seen(), "returned at once, not polled")
	assert.Zero(t, src.calls.Load())
}

// TestTransientErrorsThatLastAreReturned: a transient reply that outlasts
// the budget (a client on a replica gets READONLY for ever) is returned,
// naming it, under every policy, rather than turned into uncached loads.
func TestTransientErrorsThatLastAreReturned(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		rdb, p := setup(t)
		hook := redistest.FailCommands(redistest.IsScript, replyError(t, rdb, "READONLY You can't write against a read only replica."), 1<<30)
		rdb.AddHook(hook)
		src := &counter{}
		_, err := New[product](rdb, WithFailurePolicy(policy), WithRetry(3, time.Millisecond), WithoutNearCache()).GetOrLoad(t.Context(), p+"k", src.load)
		require.ErrorContains(t, err, "READONLY")
		assert.Equal(t, int64(4), hook.Seen())
		assert.Zero(t, src.calls.Load())
	}
}

// TestMisconfigurationIsReturnedUnderEveryPolicy: a missing permission used
// to be absorbed by FailOpen (100 loads, 0 errors, nothing visible).
func TestMisconfigurationIsReturnedUnderEveryPolicy(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		for _, cmd := range []string{"get", "script"} {
			rdb, p := setup(t)
			match := redistest.Named(cmd)
			if cmd == "script" {
				match = redistest.IsScript
			}
			hook := redistest.FailCommands(match, replyError(t, rdb, "NOPERM this user has no permissions to run the '"+cmd+"' command"), 1<<30)
			rdb.AddHook(hook)
			src := &counter{}
			_, err := New[product](rdb, WithFailurePolicy(policy)).GetOrLoad(t.Context(), p+"k", src.load)
			require.Error(t, err, "policy %d, %s refused", policy, cmd)
			assert.Contains(t, err.Error(), "NOPERM")
			assert.Zero(t, src.calls.Load(), "policy %d, %s refused: the loader must not run", policy, cmd)
		}
	}
}

func TestDeleteWrapsRedisErrors(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	err := New[product](dead).Delete(t.Context(), "k")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cache: redis: ")
}

// TestClosedClientIsAProgrammingError: a go-redis client closed by mistake
// is returned as such under every policy, never loaded around, never
// logged as an outage nor counted by the breaker.
func TestClosedClientIsAProgrammingError(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		for _, near := range []bool{false, true} {
			name := map[FailurePolicy]string{FailOpen: "fail open", FailClosed: "fail closed"}[policy]
			if near {
				name += ", near cache"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				rdb := redistest.Client(t, redistest.Addr(t))
				p := redistest.Prefix(t, rdb)
				logs := &logCapture{}
				var hooks, opened atomic.Int64
				opts := []Option{WithPrefix(p), WithTags(), WithFailurePolicy(policy), WithCircuitBreaker(2, DefaultBreakerCoolDown),
					WithLogger(slog.New(logs)), WithErrorHook(func(string, error) { hooks.Add(1) }),
					WithObserver(func(e Event) {
						if e.Kind == EventBreakerOpen {
							opened.Add(1)
						}
					})}
				if !near {
					opts = append(opts, WithoutNearCache())
				}
				c := New[product](rdb, opts...)
				defer c.Close()
				require.NoError(t, rdb.Close())
				src := &counter{}
				for range 20 {
					_, err := c.GetOrLoad(t.Context(), "k", src.load)
					require.True(t, errors.Is(err, redis.ErrClosed), "GetOrLoad: %v", err)
				}
				_, err := c.GetOrLoadMany(t.Context(), []string{"a", "b"}, (&source{}).loadMany)
				assert.True(t, errors.Is(err, redis.ErrClosed), "GetOrLoadMany: %v", err)
				assert.True(t, errors.Is(c.Set(t.Context(), "k", product{}), redis.ErrClosed))
				assert.True(t, errors.Is(c.Delete(t.Context(), "k"), redis.ErrClosed))
				assert.True(t, errors.Is(c.DeleteByTag(t.Context(), "t"), redis.ErrClosed))
				_, err = c.Get(t.Context(), "k")
				assert.True(t, errors.Is(err, redis.ErrClosed), "Get: %v", err)

				assert.Zero(t, src.calls.Load(), "nothing loaded around a closed client")
				assert.Zero(t, opened.Load(), "the breaker does not count a closed client")
				assert.False(t, c.Stats().BreakerOpen)
				assert.Zero(t, hooks.Load(), "returned, not absorbed")
				for _, l := range logs.lines(slog.LevelError) {
					assert.NotContains(t, l, "unreachable")
				}
			})
		}
	}
}

// A Redis out of memory (maxmemory reached) does not
// switch the protection off: hits go on, the breaker stays
// closed, a key is loaded at most once at a time per process, and the error
// hook hears of it once per episode, named as memory pressure.

// oomLoads counts a loader's calls per key, and the most that ran at once
// for one key.
type oomLoads struct {
	mu      sync.Mutex
	calls   map[string]int
	running map[string]int
	maxRun  int
}

func (l *oomLoads) load(key string, delay time.Duration) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		l.mu.Lock()
		l.calls[key]++
		l.running[key]++
		l.maxRun = max(l.maxRun, l.running[key])
		l.mu.Unlock()
		time.Sleep(delay)
		l.mu.Lock()
		l.running[key]--
		l.mu.Unlock()
		return []byte(strings.Repeat("v", 16<<10)), nil
	}
}

// hookCount counts the error hook's calls, and those naming memory.
type hookCount struct {
	all, oom, named atomic.Int64
	mu              sync.Mutex
	other           map[string]int // the other reports, by their text up to the key
}

func (h *hookCount) hook(_ string, err error) {
	h.all.Add(1)
	if !strings.Contains(err.Error(), "OOM") {
		h.mu.Lock()
		if h.other == nil {
			h.other = map[string]int{}
		}
		h.other[strings.SplitN(err.Error(), "\"", 2)[0]]++
		h.mu.Unlock()
	}
	if strings.Contains(err.Error(), "OOM") {
		h.oom.Add(1)
	}
	if strings.HasPrefix(err.Error(), "cache: redis is out of memory (maxmemory): values are not being stored: ") {
		h.named.Add(1)
	}
}

// TestOOMIsNotAnOutage: with maxmemory below what the server already uses,
// every write is refused and every read served.
func TestOOMIsNotAnOutage(t *testing.T) {
	// Not parallel: it sets health.FullQuiet, which every Cache in the process reads.
	srv := redistest.PrivateServer(t, "it sets maxmemory", "--maxmemory-policy", "noeviction")
	rdb := redistest.Client(t, srv.Addr)
	var hooks hookCount
	var opened atomic.Int64
	logs := &logCapture{}
	logger := slog.New(logs)
	caches := []*Cache[[]byte]{}
	var loads []*oomLoads // per cache: each merges its own callers
	for range 3 {         // three caches on the client, one logger
		caches = append(caches, New[[]byte](rdb, WithErrorHook(hooks.hook), eventCount(EventBreakerOpen, &opened), WithLogger(logger)))
		loads = append(loads, &oomLoads{calls: map[string]int{}, running: map[string]int{}})
	}
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	_, err := caches[0].GetOrLoad(t.Context(), "hit", loads[0].load("hit", 0))
	require.NoError(t, err)
	require.NoError(t, rdb.ConfigSet(t.Context(), "maxmemory", "1").Err())
	defer rdb.ConfigSet(context.Background(), "maxmemory", "0")

	const rounds, callers = 10, 8
	for round := range rounds {
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				c, l := caches[i%len(caches)], loads[i%len(caches)]
				key := "k" + strconv.Itoa(i%2)
				v, err := c.GetOrLoad(t.Context(), key, l.load(key, 20*time.Millisecond))
				assert.NoError(t, err, "round %d", round)
				assert.Len(t, v, 16<<10, "the loaded value is returned")
				_, err = c.GetOrLoad(t.Context(), "hit", l.load("hit", 0))
				assert.NoError(t, err)
			})
		}
		wg.Wait()
	}
	for i, l := range loads {
		t.Logf("cache %d: loads %v, at most %d at once for one key", i, l.calls, l.maxRun)
		assert.Zero(t, l.calls["hit"]-map[bool]int{true: 1}[i == 0], "hits are served under memory pressure")
		assert.Equal(t, 1, l.maxRun, "one load per key per cache at a time")
	}
	t.Logf("hook: %d calls (%d naming memory)", hooks.all.Load(), hooks.named.Load())
	assert.Zero(t, opened.Load(), "OOM must not open the breaker")
	assert.Equal(t, int64(len(caches)), hooks.named.Load(), "each cache's hook hears of the episode once")
	assert.Equal(t, hooks.named.Load(), hooks.all.Load(), "no other report")
	assert.Len(t, logs.lines(slog.LevelError), 1, "one log line for the client's episode")
	exists, err := rdb.Exists(t.Context(), "k0", "k1").Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "nothing stored")

	// The episode ends after health.FullQuiet without OOM: the next one is told again.
	old := health.FullQuiet
	health.FullQuiet = 0
	defer func() { health.FullQuiet = old }()
	time.Sleep(time.Millisecond)
	_, err = caches[0].GetOrLoad(t.Context(), "k0", loads[0].load("k0", 0))
	require.NoError(t, err)
	assert.Equal(t, int64(len(caches)+1), hooks.named.Load(), "a new episode is reported")
}

// TestOOMUnderRealPressure fills a small Redis with 16 KB values from
// several caches (separate clients, as separate processes would be) and
// goroutines, under each eviction policy, and counts loads per key and the
// hook's calls. The figures are logged (go test -v -run OOMUnderReal).
func TestOOMUnderRealPressure(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.PrivateServer(t, "it fills the server to its maxmemory", "--maxmemory-policy", policy)
			admin := redistest.Client(t, srv.Addr)
			used := memoryUsed(t, admin)
			require.NoError(t, admin.ConfigSet(t.Context(), "maxmemory", strconv.FormatInt(used+2<<20, 10)).Err())
			var hooks hookCount
			var opened atomic.Int64
			loads := &oomLoads{calls: map[string]int{}, running: map[string]int{}}
			const caches, goroutines, reads, keys = 3, 16, 150, 150
			var wg sync.WaitGroup
			var errs atomic.Int64
			for i := range caches {
				rdb := redistest.Client(t, srv.Addr)
				c := New[[]byte](rdb, WithCodec(rawCodec{}), WithErrorHook(hooks.hook), eventCount(EventBreakerOpen, &opened), WithLogger(nil))
				defer c.Close()
				for g := range goroutines {
					wg.Go(func() {
						for r := range reads {
							key := "k" + strconv.Itoa((i*7+g*13+r*31)%keys)
							if _, err := c.GetOrLoad(context.Background(), key, loads.load(key, time.Millisecond)); err != nil {
								errs.Add(1)
							}
						}
					})
				}
			}
			wg.Wait()
			loads.mu.Lock()
			defer loads.mu.Unlock()
			total, most := 0, 0
			for _, n := range loads.calls {
				total += n
				most = max(most, n)
			}
			info := admin.Info(t.Context(), "stats").Val()
			t.Logf("%s: %d reads, %d loads, at most %d loads of one key; breaker opened %d times; hook: %d calls, %d naming OOM, %d as memory pressure; errors %d; %s; other reports %v",
				policy, caches*goroutines*reads, total, most, opened.Load(), hooks.all.Load(), hooks.oom.Load(), hooks.named.Load(), errs.Load(), evictions(info), hooks.other)
			assert.Zero(t, errs.Load())
			assert.Zero(t, opened.Load(), "OOM must not open the breaker")
			assert.LessOrEqual(t, hooks.named.Load(), int64(caches), "the hook hears of memory pressure at most once per cache")
			assert.Equal(t, hooks.named.Load(), hooks.oom.Load(), "every OOM report is the memory-pressure one")
		})
	}
}

func memoryUsed(t *testing.T, rdb *redis.Client) int64 {
	for _, line := range strings.Split(rdb.Info(t.Context(), "memory").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

func evictions(info string) string {
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "evicted_keys:") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// rawCodec stores a []byte as it is. The pressure test moves about 100 MB
// of values; encoding/json's base64 and validation of them took four fifths
// of its CPU time under -race (60 s of 70).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return append([]byte(nil), v.([]byte)...), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
