// This file runs a short demo against the test harness's real Redis and
// an embedded FerretDB and checks its verdict, in one process and in several.
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec)) // a -procs child re-executed from a test
	}
	code := m.Run()
	redistest.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestDemoVerdict counts events, not throughput: the traffic of the
// library's strategies (stampede, stampede-near) goes on until the hot key
// has expired the wanted number of times (a busy machine, compiling other
// packages on the same cores, just takes longer), bounded by a generous
// limit that only a hang reaches. The others run their duration: one expiry
// (the cold start) is all their checks need.
func TestDemoVerdict(t *testing.T) {
	const minExpiries = 2 // the cold start and one TTL expiry under traffic
	tests := []struct {
		name string
		cfg  config
	}{
		{"goroutines", config{Instances: 3, Goroutines: 6}},
		{"procs", config{Procs: 2, Goroutines: 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Duration, cfg.MinExpiries, cfg.MaxDuration = time.Second, minExpiries, 2*time.Minute
			cfg.TTL, cfg.LoadDelay, cfg.Products = 500*time.Millisecond, 50*time.Millisecond, 1000
			cfg.RedisAddr = redistest.Addr(t)
			if err := cfg.check(); err != nil {
				t.Fatal(err)
			}
			var out, errw bytes.Buffer
			rep, err := run(t.Context(), cfg, &out, &errw)
			if err != nil {
				t.Fatalf("run: %v\n%s", err, errw.String())
			}
			t.Logf("\n%s", out.String())
			if !rep.OK {
				t.Errorf("%s", rep.Verdict)
			}
			for _, strategy := range []string{"stampede", "stampede-near"} {
				if s := rep.get(strategy); s.CutShort || s.Expiries < minExpiries {
					t.Errorf("%s: %d expiries in %.1fs of traffic (cut short: %v); want at least %d",
						strategy, s.Expiries, s.DurationS, s.CutShort, minExpiries)
				}
			}
			for _, r := range rep.Results {
				if r.Errors != 0 {
					t.Errorf("%s: %d errors (first: %s); want 0", r.Strategy, r.Errors, r.FirstError)
				}
				if r.DBLoadsServer != r.DBLoads {
					t.Errorf("%s: database served %d finds, loader counted %d; want equal", r.Strategy, r.DBLoadsServer, r.DBLoads)
				}
				if r.RedisCmdsMethod != "server INFO commandstats" || r.RedisCmds <= 0 {
					t.Errorf("%s: redis cmds %d by %q; want a positive count from the server", r.Strategy, r.RedisCmds, r.RedisCmdsMethod)
				}
			}
			for _, strategy := range []string{"stampede", "stampede-near"} {
				s := rep.get(strategy)
				if s.DBLoads != int64(s.Expiries) || s.MaxLoadsExpiry != 1 {
					t.Errorf("%s: %d loads, %d expiries, up to %d in one; want one per expiry",
						strategy, s.DBLoads, s.Expiries, s.MaxLoadsExpiry)
				}
			}
			// Between expiries the hot key is in memory: most requests are
			// near hits (counted by an observer, in the children too).
			if sn := rep.get("stampede-near"); sn.NearHits*2 <= sn.Requests {
				t.Errorf("stampede-near: %d near hits of %d requests; want more than half", sn.NearHits, sn.Requests)
			}
			n := rep.get("naive")
			// Every request goroutine misses together on a cold key; ask for a
			// third of them so a slow, busy machine still passes.
			if want := float64(cfg.Instances*cfg.Goroutines) / 3; n.LoadsPerExpiry < want {
				t.Errorf("naive: %.1f loads per expiry; want at least %.0f", n.LoadsPerExpiry, want)
			}
		})
	}
}

func TestWindowWaitsForExpiries(t *testing.T) {
	ms := func(start, end int64) span { return span{Start: start * 1e6, End: end * 1e6} }
	cfg := config{Duration: 10 * time.Millisecond, MinExpiries: 2, MaxDuration: time.Minute, TTL: 100 * time.Millisecond}
	live := &counters{}
	w := newWindow(cfg, live)
	w.open(t.Context())
	live.addSpans(ms(0, 10))
	select {
	case <-w.stop:
		t.Fatal("window closed after 1 expiry; want it open until 2")
	case <-time.After(200 * time.Millisecond): // well past Duration
	}
	live.addSpans(ms(200, 210)) // after the first value's TTL: a second expiry
	select {
	case <-w.stop:
	case <-time.After(10 * time.Second):
		t.Fatal("window still open after 2 expiries")
	}
	if ran, short := w.close(); short || ran < cfg.Duration {
		t.Errorf("close() = %v, %v; want at least %v, false", ran, short, cfg.Duration)
	}
}

func TestWindowMaxDuration(t *testing.T) {
	cfg := config{Duration: 10 * time.Millisecond, MinExpiries: 5, MaxDuration: 100 * time.Millisecond, TTL: time.Second}
	w := newWindow(cfg, &counters{})
	w.open(t.Context())
	select {
	case <-w.stop:
	case <-time.After(10 * time.Second):
		t.Fatal("window still open past MaxDuration")
	}
	if ran, short := w.close(); !short || ran < cfg.MaxDuration {
		t.Errorf("close() = %v, %v; want at least %v, true", ran, short, cfg.MaxDuration)
	}
}

func TestExpiries(t *testing.T) {
	ms := func(start, end int64) span { return span{Start: start * 1e6, End: end * 1e6} }
	ttl := 100 * time.Millisecond
	tests := []struct {
		name     string
		loads    []span
		wantN    int
		wantMost int
	}{
		{"none", nil, 0, 0},
		{"one per window", []span{ms(0, 10), ms(115, 125), ms(230, 240)}, 3, 1},
		{"duplicates in the cold start", []span{ms(0, 10), ms(1, 12), ms(2, 30)}, 1, 3},
		// The duplicate's SET at 60ms keeps the value until 160ms, past 120ms.
		{"late duplicate keeps the value alive", []span{ms(0, 10), ms(5, 60), ms(120, 130)}, 1, 3},
		{"unsorted", []span{ms(230, 240), ms(0, 10), ms(115, 125), ms(116, 126)}, 3, 2},
		// The value of the load that ended at 10ms expired at 109ms (its
		// expiry is whole milliseconds); a load at 109.5ms found a new miss.
		{"within the expiry's resolution", []span{ms(0, 10), {Start: 109_500_000, End: 120_000_000}}, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, most := expiries(tt.loads, ttl)
			if n != tt.wantN || most != tt.wantMost {
				t.Errorf("expiries(%v) = %d, %d; want %d, %d", tt.loads, n, most, tt.wantN, tt.wantMost)
			}
		})
	}
}

func TestHistQuantile(t *testing.T) {
	h := hist{}
	for i := 1; i <= 100; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 50}, {0.99, 99}, {1, 100}} {
		if got := h.quantile(c.q); got != c.want {
			t.Errorf("quantile(%v) = %vms; want %vms", c.q, got, c.want)
		}
	}
}

// TestVerdictNamesTheRowItCouldNotShow: on a Redis without client-side
// caching stampede-near serves nothing from memory, and the verdict must say
// so instead of calling the run OK.
func TestVerdictNamesTheRowItCouldNotShow(t *testing.T) {
	results := func(nearHits int64) []result {
		var rs []result
		for _, s := range strategies {
			rs = append(rs, result{Strategy: s, Requests: 1000, DBLoads: 2, DBLoadsServer: -1, Expiries: 2, MaxLoadsExpiry: 1, LoadsPerExpiry: 1})
		}
		rs[len(rs)-1].NearHits = nearHits // stampede-near
		return rs
	}
	for _, tt := range []struct {
		name      string
		miniredis bool
		nearHits  int64
		want      string
	}{
		{"miniredis", true, 0, "verdict: INCOMPLETE - "},
		{"redis without tracking", false, 0, "verdict: INCOMPLETE - "},
		{"near hits", false, 900, "verdict: OK - "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &report{env: &env{miniredis: tt.miniredis}, Results: results(tt.nearHits)}
			r.judge()
			if !strings.HasPrefix(r.Verdict, tt.want) {
				t.Errorf("verdict %q; want it to begin with %q", r.Verdict, tt.want)
			}
			if tt.nearHits == 0 && !strings.Contains(r.Verdict, "stampede-near NOT SHOWN") {
				t.Errorf("verdict %q does not name stampede-near as not shown", r.Verdict)
			}
			var out bytes.Buffer
			r.writeTable(&out)
			if shown := !strings.Contains(out.String(), "NOT SHOWN in this run"); shown != (tt.nearHits > 0) {
				t.Errorf("table says the near row was shown: %v; want %v\n%s", shown, tt.nearHits > 0, out.String())
			}
		})
	}
}

// TestDemoUsesRedisServerFromPath: the default run (no REDIS_ADDR) starts a
// redis-server from PATH, whose client-side caching lets stampede-near
// serve from memory; miniredis only when there is none.
func TestDemoUsesRedisServerFromPath(t *testing.T) {
	// Not parallel: the second case empties PATH.
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server on PATH")
	}
	e := &env{}
	if err := e.startRedis(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if e.miniredis || e.redisCommands(t.Context()) < 0 {
		t.Errorf("default run on %s (miniredis %v); want a redis-server from PATH", e.redisDesc, e.miniredis)
	}
	e.close()

	t.Setenv("PATH", "")
	e = &env{}
	if err := e.startRedis(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	defer e.close()
	if !e.miniredis {
		t.Errorf("run without redis-server on PATH on %s; want the embedded miniredis", e.redisDesc)
	}
}
