// This file proves that a Redis out of memory (maxmemory reached) does not
// switch the protection off: hits go on, the breaker stays
// closed, a key is loaded at most once at a time per process, and the error
// hook hears of it once per episode, named as memory pressure.

package cache

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/health"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
