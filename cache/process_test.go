// This file proves the cross-process claims with real OS processes: the
// test binary re-executes itself as a child that serves callers or holds the
// load lock, and the parent counts loads, kills and freezes it.

package cache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childModes are the child programs of the multi-process tests, by mode.
var childModes = map[string]proctest.Mode{
	"stampede": runStampedeChild,
	"hold":     runHoldChild,
}

// childCache is a child's Cache on the Redis at env("REDIS"), with the
// lock TTL env("LOCK_TTL"); it reports lost locks and voided loads on
// stdout ("event <kind>", "hook <error>").
func childCache(env func(string) string) (*redis.Client, *Cache[product]) {
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	c := New[product](rdb, WithLockTTL(childDuration(env, "LOCK_TTL")), WithRetry(200, 50*time.Millisecond),
		WithObserver(func(e Event) {
			if e.Kind == EventLockLost || e.Kind == EventLoadVoided {
				fmt.Println("event", e.Kind)
			}
		}),
		WithErrorHook(func(_ string, err error) {
			if errors.Is(err, ErrLoadLockLost) {
				fmt.Println("hook", err)
			}
		}))
	return rdb, c
}

func childDuration(env func(string) string, k string) time.Duration {
	d, _ := time.ParseDuration(env(k))
	return d
}

// runStampedeChild prints "ready", waits for a line on stdin, runs CALLERS
// goroutines on KEY with a loader that INCRs KEY:loads and sleeps DELAY,
// and prints "done <errors>".
func runStampedeChild(env func(string) string) int {
	rdb, c := childCache(env)
	defer rdb.Close()
	key := env("KEY")
	ctx := context.Background()
	callers, _ := strconv.Atoi(env("CALLERS"))
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 2
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := 0
	for range callers {
		wg.Go(func() {
			_, err := c.GetOrLoad(ctx, key, func(ctx context.Context) (product, error) {
				rdb.Incr(ctx, key+":loads")
				time.Sleep(childDuration(env, "DELAY"))
				return product{ID: "p1", Price: os.Getpid()}, nil
			})
			if err != nil {
				mu.Lock()
				errs++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Println("done", errs)
	return 0
}

// runHoldChild takes KEY's lock by loading with a loader that prints
// "loading", sleeps LOAD_FOR and returns product{ID: VALUE}; then it prints
// "returned <id>".
func runHoldChild(env func(string) string) int {
	rdb, c := childCache(env)
	defer rdb.Close()
	v, err := c.GetOrLoad(context.Background(), env("KEY"), func(ctx context.Context) (product, error) {
		fmt.Println("loading")
		time.Sleep(childDuration(env, "LOAD_FOR"))
		return product{ID: env("VALUE")}, nil
	})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("returned", v.ID)
	return 0
}

// childSays is how long a test waits for a child's next line.
const childSays = 30 * time.Second

func TestProcessesLoadOnce(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "hot"
	const procs, callers = 4, 50
	var children []*proctest.Child
	for range procs {
		children = append(children, proctest.Start(t, "stampede", map[string]string{
			"REDIS": redistest.Addr(t), "KEY": key, "CALLERS": strconv.Itoa(callers),
			"DELAY": "300ms", "LOCK_TTL": "2s",
		}))
	}
	for _, c := range children {
		c.Expect(t, "ready", childSays)
	}
	for _, c := range children {
		c.Send(t, "go")
	}
	for i, c := range children {
		if errs := c.Expect(t, "done", childSays); errs != "0" {
			t.Errorf("child %d: %s of %d callers failed", i, errs, callers)
		}
	}
	loads, err := rdb.Get(t.Context(), key+":loads").Int()
	require.NoError(t, err)
	if loads != 1 {
		t.Fatalf("%d processes x %d goroutines loaded %d times; want 1", procs, callers, loads)
	}
}

// commandCalls sums INFO commandstats calls of the commands the cache sends
// (and the commands its scripts run), leaving out connection set-up.
func commandCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	require.NoError(t, err)
	total := 0
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok || name == "info" || name == "hello" || name == "ping" || strings.HasPrefix(name, "client") || strings.HasPrefix(name, "config") {
			continue
		}
		n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		total += n
	}
	return total
}

func TestRedisCommandsGrowWithInstancesNotCallers(t *testing.T) {
	// Not parallel: its command counts move with the polls' timing.
	// CONFIG RESETSTAT and INFO commandstats are server-wide: this test must not
	// reset a server it did not start, nor count other tests' commands.
	srv := redistest.PrivateServer(t, "counting commands with INFO commandstats needs a server no other test uses")
	admin := redistest.Client(t, srv.Addr)
	const instances = 4
	var caches []*Cache[product]
	for range instances {
		// Without near caches: their lease renewals (a script of four
		// commands per instance every quarter second) would be counted too.
		caches = append(caches, New[product](redistest.Client(t, srv.Addr), WithRetry(100, 100*time.Millisecond), WithoutNearCache()))
	}
	src := &counter{delay: 250 * time.Millisecond}
	stampede(t, caches, 1, "warm-up", src.load) // load the scripts, open the connections

	cost := func(callers int) int {
		key := fmt.Sprintf("k-%d", callers)
		require.NoError(t, admin.ConfigResetStat(t.Context()).Err())
		_, errs := stampede(t, caches, callers, key, src.load)
		for _, err := range errs {
			require.NoError(t, err)
		}
		return commandCalls(t, admin)
	}
	one, many := cost(1), cost(100)
	t.Logf("one stampede of %d instances: %d commands with 1 caller each, %d with 100 callers each", instances, one, many)
	// Waiters poll every 100ms for the same 250ms load, so the two costs differ
	// only by timing: one poll per instance either way.
	assert.LessOrEqual(t, many, one+3*instances, "commands must not grow with callers")
	assert.Less(t, many, instances*100/4, "400 callers must cost far fewer than 400 commands")
}

func TestCrashedHolderBlocksOthersAtMostLockTTL(t *testing.T) {
	// Not parallel: it times the wait to the lock TTL plus 500 ms.
	rdb, p := setup(t)
	key := p + "k"
	const lockTTL = time.Second
	holder := proctest.Start(t, "hold", map[string]string{
		"REDIS": redistest.Addr(t), "KEY": key, "LOCK_TTL": lockTTL.String(), "LOAD_FOR": "1h", "VALUE": "never",
	})
	holder.Expect(t, "loading", childSays)
	require.NoError(t, holder.Process().Kill())
	_ = holder.Wait()

	start := time.Now()
	src := &counter{}
	v, err := New[product](rdb, WithLockTTL(lockTTL), WithRetry(100, 20*time.Millisecond)).GetOrLoad(t.Context(), key, src.load)
	waited := time.Since(start)

	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID)
	assert.Equal(t, int64(1), src.calls.Load())
	t.Logf("after SIGKILL of the holder, the next caller loaded after %v (lock TTL %v)", waited, lockTTL)
	// The lease runs out at most lockTTL after the holder's last refresh; allow a
	// poll interval and scheduling on top.
	assert.Less(t, waited, lockTTL+500*time.Millisecond)
}

func TestFrozenHolderCannotOverwriteNewerValue(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	const lockTTL = 300 * time.Millisecond
	holder := proctest.Start(t, "hold", map[string]string{
		"REDIS": redistest.Addr(t), "KEY": key, "LOCK_TTL": lockTTL.String(), "LOAD_FOR": "1s", "VALUE": "old",
	})
	holder.Expect(t, "loading", childSays)
	require.NoError(t, holder.Process().Signal(syscall.SIGSTOP))
	time.Sleep(2 * lockTTL) // the frozen watchdog cannot extend the lease

	c := New[product](rdb, WithLockTTL(lockTTL), WithRetry(100, 20*time.Millisecond))
	v, err := c.GetOrLoad(t.Context(), key, func(context.Context) (product, error) { return product{ID: "new"}, nil })
	require.NoError(t, err)
	require.Equal(t, "new", v.ID)

	require.NoError(t, holder.Process().Signal(syscall.SIGCONT))
	// A real loss, not a write winning over the load: an error, not just an event.
	assert.Equal(t, "lock_lost", holder.Expect(t, "event", childSays))
	assert.Contains(t, holder.Expect(t, "hook", childSays), "its lock ran out")
	assert.Equal(t, "old", holder.Expect(t, "returned", childSays), "the frozen holder's own caller gets what it loaded")
	require.NoError(t, holder.Wait())

	raw, err := rdb.Get(t.Context(), key).Bytes()
	require.NoError(t, err)
	var got product
	_, payload, err := record.Decode(raw)
	require.NoError(t, err)
	require.NoError(t, JSON.Unmarshal(payload, &got))
	assert.Equal(t, "new", got.ID, "a holder frozen past its lock TTL overwrote the newer value")
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
