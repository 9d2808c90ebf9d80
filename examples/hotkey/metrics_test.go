// This file runs a short demo with -metrics and reads the table of the
// OpenTelemetry adapter's figures: counts of events, no timing.

package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stampede-go/stampede/internal/redistest"
)

func TestDemoMetrics(t *testing.T) {
	cfg := config{Instances: 2, Goroutines: 4, Metrics: true}
	// One expiry at least, the cold start: the traffic stops after
	// Duration, long enough for the near cache to take its first lease and
	// serve on a machine busy with other tests (500 ms was not: its row
	// served 11 requests, none from memory).
	cfg.Duration, cfg.MinExpiries, cfg.MaxDuration = 3*time.Second, 1, 2*time.Minute
	cfg.TTL, cfg.LoadDelay, cfg.Products = 300*time.Millisecond, 20*time.Millisecond, 100
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
	if cacheOptions != nil {
		t.Error("the observer is still set after the run; want it removed")
	}

	rows := metricsTable(t, out.String())
	for _, strategy := range []string{"stampede", "stampede-near"} {
		s := rep.get(strategy)
		loads, hits, misses := rows["cache.load.duration "+strategy+" cache.outcome=ok"],
			rows["cache.lookups "+strategy+" cache.lookup.result=hit"], rows["cache.lookups "+strategy+" cache.lookup.result=miss"]
		if loads != s.DBLoads || loads == 0 {
			t.Errorf("%s: cache.load.duration{ok} count = %d; want its %d database loads, at least 1", strategy, loads, s.DBLoads)
		}
		if misses == 0 || strategy == "stampede" && hits == 0 {
			t.Errorf("%s: cache.lookups: %d hits, %d misses; want misses (the cold start), and hits for stampede", strategy, hits, misses)
		}
	}
	// The demo's own count of memory hits and the adapter's agree.
	if near, want := rows["cache.near.hits stampede-near"], rep.get("stampede-near").NearHits; near != want || near == 0 {
		t.Errorf("cache.near.hits{stampede-near} = %d; want %d, the near hits the demo counted, at least 1", near, want)
	}
	if _, ok := rows["cache.near.hits stampede"]; ok {
		t.Error("cache.near.hits recorded for stampede, which has no near cache")
	}
	for k := range rows {
		if strings.Contains(k, "=error") {
			t.Errorf("%s = %d; want no errors", k, rows[k])
		}
	}
}

func TestMetricsNeedOneProcess(t *testing.T) {
	cfg := config{Procs: 2, Goroutines: 1, Duration: time.Second, TTL: time.Second, Products: 1, Metrics: true}
	if err := cfg.check(); err == nil {
		t.Error("check() accepted -metrics with -procs; want an error (the figures would miss the children)")
	}
}

// metricsTable parses the -metrics table: "metric cache.name attrs" to a
// counter's value or a histogram's count.
func metricsTable(t *testing.T, out string) map[string]int64 {
	t.Helper()
	_, table, ok := strings.Cut(out, "metrics of the stampede caches")
	if !ok {
		t.Fatal("no metrics table in the output")
	}
	rows := map[string]int64{}
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], "cache.") {
			continue
		}
		if strings.HasSuffix(f[len(f)-1], "s") { // a histogram's sum
			f = f[:len(f)-1]
		}
		n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
		if err != nil {
			t.Fatalf("metrics table line %q: %v", line, err)
		}
		rows[strings.Join(f[:len(f)-1], " ")] = n
	}
	return rows
}
