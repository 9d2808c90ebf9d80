// This file proves the cross-process claims with real OS processes: the
// test binary re-executes itself as a child that serves callers or holds the
// load lock, and the parent counts loads, kills and freezes it.

package cache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const childModeEnv = "STAMPEDE_TEST_CHILD"

// runChild is the child side. It reads its orders from the environment,
// reports on stdout one line per event, and returns the exit code.
//
//	stampede: print "ready", wait for a line on stdin, run CALLERS goroutines
//	          on KEY with a loader that INCRs KEY:loads and sleeps DELAY,
//	          print "done <errors>".
//	hold:     take KEY's lock by loading with a loader that prints "loading",
//	          sleeps LOAD_FOR and returns product{ID: VALUE}; print
//	          "returned <id>".
func runChild(mode string) int {
	env := func(k string) string { return os.Getenv("CHILD_" + k) }
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(env(k)); return d }
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	defer rdb.Close()
	c := New[product](rdb, WithLockTTL(dur("LOCK_TTL")), WithRetry(200, 50*time.Millisecond),
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
	key := env("KEY")
	ctx := context.Background()

	switch mode {
	case "stampede":
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
					time.Sleep(dur("DELAY"))
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
	case "hold":
		v, err := c.GetOrLoad(ctx, key, func(ctx context.Context) (product, error) {
			fmt.Println("loading")
			time.Sleep(dur("LOAD_FOR"))
			return product{ID: env("VALUE")}, nil
		})
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("returned", v.ID)
	default:
		return 2
	}
	return 0
}

// child is a running child process of the test binary.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startChild(t *testing.T, mode string, env map[string]string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode)
	for k, v := range env {
		cmd.Env = append(cmd.Env, "CHILD_"+k+"="+v)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a frozen child cannot die
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// expect waits for the child's next line and checks its first word.
func (c *child) expect(t *testing.T, word string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			t.Fatalf("child exited while the test waited for %q", word)
		}
		if !strings.HasPrefix(line, word) {
			t.Fatalf("child said %q; want %q", line, word)
		}
		return strings.TrimSpace(strings.TrimPrefix(line, word))
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not say %q within 30s", word)
	}
	return ""
}

func TestProcessesLoadOnce(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "hot"
	const procs, callers = 4, 50
	var children []*child
	for range procs {
		children = append(children, startChild(t, "stampede", map[string]string{
			"REDIS": redistest.Addr(t), "KEY": key, "CALLERS": strconv.Itoa(callers),
			"DELAY": "300ms", "LOCK_TTL": "2s",
		}))
	}
	for _, c := range children {
		c.expect(t, "ready")
	}
	for _, c := range children {
		_, err := io.WriteString(c.stdin, "go\n")
		require.NoError(t, err)
	}
	for i, c := range children {
		if errs := c.expect(t, "done"); errs != "0" {
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
	holder := startChild(t, "hold", map[string]string{
		"REDIS": redistest.Addr(t), "KEY": key, "LOCK_TTL": lockTTL.String(), "LOAD_FOR": "1h", "VALUE": "never",
	})
	holder.expect(t, "loading")
	require.NoError(t, holder.cmd.Process.Kill())
	_ = holder.cmd.Wait()

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
	holder := startChild(t, "hold", map[string]string{
		"REDIS": redistest.Addr(t), "KEY": key, "LOCK_TTL": lockTTL.String(), "LOAD_FOR": "1s", "VALUE": "old",
	})
	holder.expect(t, "loading")
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(2 * lockTTL) // the frozen watchdog cannot extend the lease

	c := New[product](rdb, WithLockTTL(lockTTL), WithRetry(100, 20*time.Millisecond))
	v, err := c.GetOrLoad(t.Context(), key, func(context.Context) (product, error) { return product{ID: "new"}, nil })
	require.NoError(t, err)
	require.Equal(t, "new", v.ID)

	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGCONT))
	// A real loss, not a write winning over the load: an error, not just an event.
	assert.Equal(t, "lock_lost", holder.expect(t, "event"))
	assert.Contains(t, holder.expect(t, "hook"), "its lock ran out")
	assert.Equal(t, "old", holder.expect(t, "returned"), "the frozen holder's own caller gets what it loaded")
	require.NoError(t, holder.cmd.Wait())

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
