// Package redistest finds or starts the real Redis that the tests of this
// repository run against: REDIS_ADDR if set, else a redis:7 container
// started with the docker CLI where a Docker engine answers, else a
// redis-server from PATH started on a free loopback port.
//
// It uses the docker CLI rather than testcontainers-go on purpose: this
// package is in the root module, and every requirement of that module lands
// in the go.sum of a project that imports the cache package.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"github.com/stampede-go/stampede/internal/leaktest"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const howToGetOne = "no Redis for the tests: set REDIS_ADDR=host:port, start a Docker engine " +
	"(the tests run redis:7 with the docker CLI), or put redis-server on PATH " +
	"(Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"

var shared struct {
	once sync.Once
	addr string
	stop func()
	err  error
}

// Addr returns the address of the shared test Redis, finding or starting it
// on first use. Tests must use their own keys (see [Prefix]) and never flush
// it. Call [Stop] from TestMain to stop a server this package started.
func Addr(tb testing.TB) string {
	tb.Helper()
	addr, err := get()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}

// Export sets REDIS_ADDR to the shared test Redis, for code that finds Redis
// the way users' code does (the package examples).
func Export() error {
	addr, err := get()
	if err != nil {
		return err
	}
	return os.Setenv("REDIS_ADDR", addr)
}

func get() (string, error) {
	shared.once.Do(func() { shared.addr, shared.stop, shared.err = find() })
	return shared.addr, shared.err
}

// Stop stops the shared Redis if this package started it.
func Stop() {
	if shared.stop != nil {
		shared.stop()
	}
}

func find() (string, func(), error) {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr, nil, ping(addr, 5*time.Second)
	}
	addr, stop, cerr := container()
	if cerr == nil {
		return addr, stop, nil
	}
	s, err := StartServer()
	if err != nil {
		return "", nil, fmt.Errorf("%s (docker: %v; redis-server: %v)", howToGetOne, cerr, err)
	}
	return s.Addr, s.Stop, nil
}

// image is the Redis image started when a Docker engine runs.
const image = "redis:7"

// container starts Redis in a Docker container through the docker CLI, only
// when `docker info` answers quickly, so a machine without an engine falls
// through to redis-server at once. The container publishes its port on a
// free loopback port and is removed by the returned stop function (and by
// Docker when it stops: --rm).
func container() (string, func(), error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = exec.CommandContext(ctx, docker, "info").Run()
	cancel()
	if err != nil {
		return "", nil, fmt.Errorf("docker info: %w", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute) // may pull the image
	defer cancel()
	out, err := exec.CommandContext(ctx, docker, "run", "-d", "--rm",
		"--label", "org.stampede-go.redistest=1", "-p", "127.0.0.1::6379", image,
		"redis-server", "--save", "", "--appendonly", "no").Output()
	if err != nil {
		return "", nil, fmt.Errorf("docker run %s: %w%s", image, err, stderrOf(err))
	}
	id := strings.TrimSpace(string(out))
	stop := func() { _ = exec.Command(docker, "rm", "-f", id).Run() }
	out, err = exec.CommandContext(ctx, docker, "port", id, "6379/tcp").Output()
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("docker port: %w%s", err, stderrOf(err))
	}
	addr, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n") // "127.0.0.1:49153"
	if err := ping(addr, 30*time.Second); err != nil {
		stop()
		return "", nil, err
	}
	return addr, stop, nil
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// Server is a redis-server process this package started; tests may kill,
// freeze or restart it.
type Server struct {
	Addr string
	Port int
	dir  string
	args []string

	mu  sync.Mutex // protects cmd
	cmd *exec.Cmd
}

// StartServer starts a private redis-server from PATH on a free loopback
// port, with persistence off. Extra args are passed to redis-server
// (for example "--cluster-enabled", "yes"). A cluster node started without
// "--cluster-port" gets a port whose cluster bus port, port+10000 (the only
// one Redis 6.2 knows), is free too: see [Server.BusPort].
func StartServer(extra ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, err
	}
	pick := freePort
	if clusterNode(extra) {
		pick = freeBusPair
	}
	port, err := pick()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Port: port,
		dir:  dir,
		args: append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", ""}, extra...),
	}
	if err := s.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// NewServer is StartServer for a test: it fails the test without a
// redis-server binary and stops the server when the test ends.
func NewServer(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	s, err := StartServer(extra...)
	if err != nil {
		tb.Fatalf("start redis-server: %v (install it: apt-get install redis-server)", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// RequirePrivateEnv, set to 1, turns the skip of [PrivateServer] into a
// failure: CI sets it so that no test is skipped there for want of a binary.
const RequirePrivateEnv = "REDISTEST_REQUIRE_PRIVATE"

// PrivateServer is [NewServer] for a test that cannot use the shared test
// Redis (it reads or resets server-wide counters, needs cluster mode, or
// kills the server): without a redis-server binary on PATH the test is
// skipped with a message that says why (the why argument) and how to run it,
// or fails if REDISTEST_REQUIRE_PRIVATE=1.
func PrivateServer(tb testing.TB, why string, extra ...string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := fmt.Sprintf("%s, so it starts its own redis-server, and there is none on PATH "+
			"(REDIS_ADDR alone cannot run it; Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)", why)
		if os.Getenv(RequirePrivateEnv) == "1" {
			tb.Fatalf("%s; %s=1 forbids skipping", msg, RequirePrivateEnv)
		}
		tb.Skip(msg)
	}
	return NewServer(tb, extra...)
}

// Start (re)starts the server process on its port and waits until it answers.
func (s *Server) Start() error {
	cmd := exec.Command("redis-server", s.args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	if err := ping(s.Addr, 10*time.Second); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	return nil
}

// Kill ends the server with SIGKILL and waits for it to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// Process is the running server process, nil when it is down.
func (s *Server) Process() *os.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.cmd.Process
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}

// BusPort is the cluster bus port of a cluster node started without
// "--cluster-port": port+10000, which CLUSTER MEET must name.
func (s *Server) BusPort() int { return s.Port + 10000 }

// clusterNode reports whether args enable cluster mode and leave the bus
// port to its default.
func clusterNode(args []string) bool {
	enabled, busPort := false, false
	for i, a := range args {
		switch a {
		case "--cluster-enabled":
			enabled = i+1 < len(args) && args[i+1] == "yes"
		case "--cluster-port":
			busPort = true
		}
	}
	return enabled && !busPort
}

// freeBusPair returns a free port p whose bus port p+10000 is free too. Both
// are below the ephemeral range Linux uses by default (32768 and up), so an
// outgoing connection does not take the bus port between this check and the
// server's bind, nor after a restart.
func freeBusPair() (int, error) {
	const lo, hi = 15000, 22767 // bus ports 25000..32767
	for range 200 {
		p := lo + mrand.IntN(hi-lo+1)
		a, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		a.Close()
		if err != nil {
			continue
		}
		b.Close()
		return p, nil
	}
	return 0, errors.New("redistest: no free port pair (p, p+10000) for a cluster node")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func ping(addr string, within time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis at %s does not answer: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a client of the Redis at addr, closed when the test ends.
func Client(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true}) // bounded, as the cache asks (see cache.New)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// DialOnce makes o's pool give up a refused dial at once, as go-redis did
// up to v9.5 (the root module's lowest): later versions try 5 times, 100 ms
// apart (Options.DialerRetries, a field v9.5 lacks), and the tests of an
// unreachable Redis paid 0.4 s for every call that dialled.
func DialOnce(o *redis.Options) *redis.Options {
	if f := reflect.ValueOf(o).Elem().FieldByName("DialerRetries"); f.IsValid() && f.CanInt() {
		f.SetInt(1)
	}
	return o
}

// Prefix returns a key prefix unique to this test run and test, and deletes
// every key under it when the test ends, so tests can share a server.
func Prefix(tb testing.TB, rdb redis.UniversalClient) string {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", ":", " ", "_").Replace(tb.Name())
	p := "stampedetest:" + name + ":" + hex.EncodeToString(b[:]) + ":"
	tb.Cleanup(func() { DeletePrefix(rdb, p) })
	return p
}

// DeletePrefix deletes every key that starts with prefix, and the load locks
// of those keys: the value key followed by "{T}:stampede:lock" (matched by
// the prefix), or "{T}:stampede:lock" followed by the value key and "}" for
// a key with a stray '{' (see cache.LockKey), and the older
// "{prefix...}:lock" shape.
func DeletePrefix(rdb redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := escape(prefix)
	for _, pattern := range []string{p + "*", "{" + p + "*", "{*}:stampede:lock" + p + "*"} {
		var keys []string
		err := forEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
			iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
			for iter.Next(ctx) {
				keys = append(keys, iter.Val())
			}
			return iter.Err()
		})
		if err != nil {
			return
		}
		for _, k := range keys {
			rdb.Del(ctx, k) // one by one: keys may be in different cluster slots
		}
	}
}

func forEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return fn(ctx, m)
		})
	case *redis.Client:
		return fn(ctx, c)
	default:
		return errors.New("redistest: unsupported client type")
	}
}

// escape quotes the glob characters Redis MATCH understands.
func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "?", `\?`, "[", `\[`, "]", `\]`, "*", `\*`).Replace(s)
}

// Main runs a package's tests against the shared test Redis and stops a
// server this package started: TestMain for packages with no child modes.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// DeadAddr is a loopback address where nothing listens and, until the test
// ends, nothing can start listening: its port is held by the client end of
// a connection (bound without SO_REUSEADDR), so a redis-server that another
// test or package starts on a free port cannot land on it, as it could on a
// port only closed after picking it.
func DeadAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server, err := l.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = client.Close()
		_ = server.Close()
	})
	return client.LocalAddr().String()
}

// Finish ends a test binary's run of code (m.Run's): it stops the servers
// the tests started and, when they passed, fails the run on goroutines they
// leaked. It returns the exit code.
func Finish(code int) int {
	Stop()
	if code == 0 {
		if err := leaktest.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			return 1
		}
	}
	return code
}

// Parallel makes n the default of -test.parallel (GOMAXPROCS otherwise),
// for a package whose parallel tests mostly wait on Redis and on timers:
// call it from TestMain before m.Run. A -parallel given to go test wins.
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}
