// This file holds the suite's shared pieces: TestMain with the leak
// check (and the child modes), simulated processes (one Redis client and one Cache each), a
// counting loader, an in-process toxiproxy and small wait helpers.
package reliability_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	proctest.RunChild(childModes)
	// Most tests here wait (for Sentinels, clusters, lock leases, loaders that
	// sleep) far more than they compute: those marked t.Parallel run six at
	// a time unless -parallel says otherwise (its default, GOMAXPROCS, is 2
	// on a 2-core machine, which leaves the cores idle). Tests whose timing
	// is tight (watchdogs, leases of a few hundred ms) or that read
	// process-wide state stay serial: they run first, alone.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "6")
	}
	code := m.Run()
	redistest.Stop()
	if code == 0 {
		// Checked once for the whole suite, after every client, proxy and
		// server is closed: a per-test check would also catch the go-redis
		// and toxiproxy goroutines that end a moment after Close returns.
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			// Give connection readers a moment to notice their sockets closed.
			time.Sleep(500 * time.Millisecond)
			if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
				fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// newClient returns a standalone client of addr, closed when the test ends.
// Tests that inject faults shorten the timeouts so a stalled link is noticed
// within the test's loose time bounds.
func newClient(tb testing.TB, addr string, tune func(*redis.Options)) *redis.Client {
	tb.Helper()
	opt := &redis.Options{Addr: addr}
	if tune != nil {
		tune(opt)
	}
	rdb := redis.NewClient(opt)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// fastFail makes a client give up on a stalled or refused link in well under
// a second, so that fault tests measure the library, not go-redis defaults.
func fastFail(o *redis.Options) {
	o.DialTimeout = 300 * time.Millisecond
	o.ReadTimeout = 300 * time.Millisecond
	o.WriteTimeout = 300 * time.Millisecond
	o.MaxRetries = 1
	o.MinRetryBackoff = 10 * time.Millisecond
	o.MaxRetryBackoff = 20 * time.Millisecond
}

// source is a fake database: it counts loads, per key and in total, and lets
// a test see and control each load.
type source struct {
	mu      sync.Mutex // protects perKey
	perKey  map[string]int
	total   atomic.Int64
	delay   time.Duration
	entered chan string   // receives each key as its load starts, if not nil
	hold    chan struct{} // if not nil, loads end only once it is closed (after the delay)
}

func newSource(delay time.Duration) *source {
	return &source{perKey: map[string]int{}, delay: delay}
}

// loader returns a loader for key that yields want after the source's delay.
func (s *source) loader(key, want string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		s.total.Add(1)
		s.mu.Lock()
		s.perKey[key]++
		s.mu.Unlock()
		if s.entered != nil {
			select {
			case s.entered <- key:
			default:
			}
		}
		if s.delay > 0 {
			select {
			case <-time.After(s.delay):
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		if s.hold != nil {
			select {
			case <-s.hold:
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		return want, nil
	}
}

func (s *source) loads(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perKey[key]
}

// outcome counts what a burst of callers got back.
type outcome struct {
	mu   sync.Mutex // protects all fields
	ok   int
	errs map[string]int
}

func (o *outcome) add(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err == nil {
		o.ok++
		return
	}
	if o.errs == nil {
		o.errs = map[string]int{}
	}
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	o.errs[msg]++
}

func (o *outcome) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprintf("ok=%d errors=%v", o.ok, o.errs)
}

// stampede runs callers goroutines per cache, all asking for key at once,
// and checks that every successful caller got want.
func stampede(t *testing.T, caches []*cache.Cache[string], callers int, key, want string,
	load func(context.Context) (string, error)) *outcome {
	t.Helper()
	var (
		out   outcome
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for _, c := range caches {
		for range callers {
			wg.Go(func() {
				<-start
				got, err := c.GetOrLoad(context.Background(), key, load)
				if err == nil && got != want {
					t.Errorf("GetOrLoad(%q) = %q; want %q", key, got, want)
				}
				out.add(err)
			})
		}
	}
	close(start)
	wg.Wait()
	return &out
}

// proxy is an in-process toxiproxy between the library and one Redis: it
// injects latency, stalls and resets on the live TCP connections.
type proxy struct {
	p *toxiproxy.Proxy
}

var proxySeq atomic.Int64

func newProxy(tb testing.TB, upstream string) *proxy {
	tb.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	name := fmt.Sprintf("redis-%d", proxySeq.Add(1))
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatalf("start toxiproxy: %v", err)
	}
	tb.Cleanup(p.Stop)
	return &proxy{p: p}
}

// Addr is where clients connect instead of Redis.
func (p *proxy) Addr() string { return p.p.Listen }

// add attaches a toxic (see toxiproxy's README for types and attributes) to
// every current and future connection. stream is "upstream" (towards Redis)
// or "downstream" (towards the client).
func (p *proxy) add(tb testing.TB, name, typ, stream string, attrs string) {
	tb.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		tb.Fatalf("add toxic %s: %v", name, err)
	}
}

func (p *proxy) remove(tb testing.TB, name string) {
	tb.Helper()
	if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		tb.Fatalf("remove toxic %s: %v", name, err)
	}
}

// retarget points the proxy at another upstream, closing every connection:
// what a virtual IP or a Sentinel-aware client does at failover.
func (p *proxy) retarget(tb testing.TB, upstream string) {
	tb.Helper()
	in := &toxiproxy.Proxy{Listen: p.p.Listen, Upstream: upstream, Enabled: true}
	if err := p.p.Update(in); err != nil {
		tb.Fatalf("retarget proxy: %v", err)
	}
}

// eventually polls cond every 10ms until it holds or within passes.
func eventually(tb testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			tb.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// lockKeyOf mirrors cache.LockKey for keys without braces: the load lock of
// key is "{key}:lock", so both land in one cluster slot.
func lockKeyOf(key string) string { return cache.LockKey(key) }

// stored reads the codec bytes the cache wrote at key (after the record
// header and its metadata), or "" when the key is absent.
func stored(tb testing.TB, rdb redis.UniversalClient, key string) string {
	tb.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		tb.Fatalf("GET %q: %v", key, err)
	}
	// Version, flags (the low four bits must be understood: none set for a
	// value), metadata length, metadata (freshness), payload.
	if len(b) < 3 || b[0] != 1 || b[1]&0x0f != 0 || len(b) < 3+int(b[2]) {
		tb.Fatalf("GET %q = %q: not a value record of this version", key, b)
	}
	return string(b[3+int(b[2]):])
}
