// This file measures one strategy (counts on both sides of each server),
// works out the expiries, and prints the table, the JSON lines and the verdict.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/stampede-go/stampede/cache"
)

// span is one database load, wall-clock Unix nanoseconds (comparable across
// processes on one machine).
type span struct {
	Start int64 `json:"s"`
	End   int64 `json:"e"`
}

// hist is a latency histogram: microseconds truncated to 3 significant
// digits (1% resolution) to the number of requests. Small, and it merges
// across processes.
type hist map[int64]int64

func (h hist) add(d time.Duration) {
	us, scale := d.Microseconds(), int64(1)
	for us >= 1000 {
		us, scale = us/10, scale*10
	}
	h[us*scale]++
}

// quantile returns the q-quantile in milliseconds.
func (h hist) quantile(q float64) float64 {
	var n int64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0
	}
	keys := slices.Sorted(func(yield func(int64) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	})
	rank := int64(math.Ceil(q * float64(n)))
	var seen int64
	for _, k := range keys {
		if seen += h[k]; seen >= rank {
			return float64(k) / 1000
		}
	}
	return float64(keys[len(keys)-1]) / 1000
}

// tally is what an instance (or a child process) counted; tallies add up.
type tally struct {
	Requests   int64  `json:"requests"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	Loads      []span `json:"loads"`
	RedisSent  int64  `json:"redis_sent"`
	NearHits   int64  `json:"near_hits"`
	Latency    hist   `json:"latency_us"`
}

func (t *tally) merge(o tally) {
	t.Requests += o.Requests
	t.Errors += o.Errors
	if t.FirstError == "" {
		t.FirstError = o.FirstError
	}
	t.Loads = append(t.Loads, o.Loads...)
	t.RedisSent += o.RedisSent
	t.NearHits += o.NearHits
	if t.Latency == nil {
		t.Latency = hist{}
	}
	for k, v := range o.Latency {
		t.Latency[k] += v
	}
}

// expiries counts the times the hot key was missing: the cold start, then
// every time its TTL ran out under traffic. A value written after a load
// that ended at time E lives until at least E+TTL (less up to a millisecond:
// the library stores the expiry in whole milliseconds, and stampede-near's
// callers, reading memory, reach Redis within microseconds of it), so a load
// that starts before the latest end in its group plus the TTL found a miss
// of that same group (a duplicate load); one that starts later found a new
// expiry. It also returns the largest number of loads any one expiry caused.
func expiries(loads []span, ttl time.Duration) (n, most int) {
	loads = slices.Clone(loads)
	slices.SortFunc(loads, func(a, b span) int { return int(a.Start - b.Start) })
	var until int64 // earliest the current value can expire
	group := 0
	for _, l := range loads {
		if n == 0 || l.Start >= until {
			n, group, until = n+1, 0, 0
		}
		group++
		most = max(most, group)
		until = max(until, l.End+(ttl-expiryResolution).Nanoseconds())
	}
	return n, most
}

// expiryResolution is how much earlier than E+TTL a value may expire (see
// expiries).
const expiryResolution = time.Millisecond

// result is one strategy's row, and its JSON line.
type result struct {
	Strategy        string  `json:"strategy"`
	Requests        int64   `json:"requests"`
	NearHits        int64   `json:"near_hits"`        // requests served from the near cache (stampede-near)
	DBLoads         int64   `json:"db_loads"`         // counted by the loader
	DBLoadsServer   int64   `json:"db_loads_server"`  // find commands the database served; -1 if it cannot tell
	Expiries        int     `json:"expiries"`         // times the hot key was missing (cold start + TTL expiries)
	LoadsPerExpiry  float64 `json:"loads_per_expiry"` // db_loads / expiries
	MaxLoadsExpiry  int     `json:"max_loads_per_expiry"`
	Errors          int64   `json:"errors"`
	FirstError      string  `json:"first_error,omitempty"`
	P50ms           float64 `json:"p50_ms"`
	P99ms           float64 `json:"p99_ms"`
	MaxMs           float64 `json:"max_ms"`
	RedisCmds       int64   `json:"redis_cmds"`
	RedisCmdsMethod string  `json:"redis_cmds_method"` // "server INFO commandstats" or "client hook"
	RedisCmdsSent   int64   `json:"redis_cmds_sent"`   // counted by a hook on every client
	Instances       int     `json:"instances"`
	Procs           int     `json:"procs"`
	Goroutines      int     `json:"goroutines_per_instance"`
	DurationS       float64 `json:"duration_s"`          // traffic time: -duration, or longer until -min-expiries
	CutShort        bool    `json:"cut_short,omitempty"` // -max-duration ended the traffic before -min-expiries
	TTLms           int64   `json:"ttl_ms"`
	LoadDelayMs     int64   `json:"load_delay_ms"`
	Redis           string  `json:"redis"`
	Mongo           string  `json:"mongo"`
}

// measure runs one strategy on a cold key and reads the servers' counters
// around it.
func measure(ctx context.Context, cfg config, e *env, strategy string, errw io.Writer) (result, error) {
	spec := instanceSpec{Strategy: strategy, RedisAddr: e.redisAddr, MongoURI: e.mongoURI, DB: e.dbName,
		Key: hotKey(e.runID, strategy), Prefix: hotPrefix(e.runID, strategy), Goroutines: cfg.Goroutines, TTL: cfg.TTL, LoadDelay: cfg.LoadDelay}
	// Cold, whatever ran before (one key per command: a cluster may hold them in two slots).
	for _, k := range []string{spec.Key, cache.LockKey(spec.Key)} {
		if err := e.rdb.Del(ctx, k).Err(); err != nil {
			return result{}, err
		}
	}
	finds0, cmds0 := e.finds(ctx), e.redisCommands(ctx)

	live := &counters{}
	wcfg := cfg
	if !judged(strategy) {
		// Only the library's loads per expiry are judged, and counting the
		// expiries of the others from their loads is unreliable once loads
		// outlast the TTL (a busy machine): the first value expires while
		// duplicate loads of the same miss still run.
		wcfg.MinExpiries = 0
	}
	w := newWindow(wcfg, live)
	stopProgress := progress(errw, strategy, cfg.Duration, live)
	var t tally
	var err error
	if cfg.Procs > 0 {
		t, err = runProcs(ctx, cfg.Procs, spec, live, w)
	} else {
		t, err = runInstances(ctx, cfg.Instances, spec, live, w)
	}
	ran, short := w.close()
	stopProgress()
	if err != nil {
		return result{}, err
	}

	finds1, cmds1 := e.finds(ctx), e.redisCommands(ctx)
	r := result{
		Strategy: strategy, Requests: t.Requests, NearHits: t.NearHits, DBLoads: int64(len(t.Loads)), DBLoadsServer: -1,
		Errors: t.Errors, FirstError: t.FirstError, P50ms: t.Latency.quantile(0.50), P99ms: t.Latency.quantile(0.99), MaxMs: t.Latency.quantile(1),
		RedisCmds: t.RedisSent, RedisCmdsMethod: "client hook", RedisCmdsSent: t.RedisSent,
		Instances: cfg.Instances, Procs: cfg.Procs, Goroutines: cfg.Goroutines, DurationS: ran.Seconds(), CutShort: short,
		TTLms: cfg.TTL.Milliseconds(), LoadDelayMs: cfg.LoadDelay.Milliseconds(),
		Redis: map[bool]string{true: "miniredis", false: "redis"}[e.miniredis],
		Mongo: map[bool]string{true: "ferretdb", false: "mongodb"}[cfg.MongoURI == ""],
	}
	if finds0 >= 0 && finds1 >= 0 {
		r.DBLoadsServer = finds1 - finds0
	}
	if cmds0 >= 0 && cmds1 >= 0 {
		r.RedisCmds, r.RedisCmdsMethod = cmds1-cmds0, "server INFO commandstats"
	}
	r.Expiries, r.MaxLoadsExpiry = expiries(t.Loads, cfg.TTL)
	if r.Expiries > 0 {
		r.LoadsPerExpiry = float64(r.DBLoads) / float64(r.Expiries)
	}
	return r, nil
}

// window decides when one strategy's traffic ends: once cfg.Duration has
// passed and the hot key has been missing cfg.MinExpiries times, counted from
// the loads themselves, so that a slow or busy machine runs longer rather
// than showing fewer expiries; or at cfg.MaxDuration whatever happened.
type window struct {
	cfg  config
	live *counters
	stop chan struct{} // closed when the traffic must end

	cancel context.CancelFunc
	wg     sync.WaitGroup
	began  time.Time
	ended  time.Time // written before stop is closed
	short  bool      // written before stop is closed
}

func newWindow(cfg config, live *counters) *window {
	return &window{cfg: cfg, live: live, stop: make(chan struct{})}
}

// open starts the clock and the watcher that closes w.stop; call it as the
// traffic starts, at most once.
func (w *window) open(ctx context.Context) {
	ctx, w.cancel = context.WithCancel(ctx)
	w.began = time.Now()
	w.wg.Go(func() {
		defer close(w.stop)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				w.ended = time.Now()
				return
			case <-t.C:
			}
			ran := time.Since(w.began)
			if ran >= w.cfg.Duration && w.live.expiries(w.cfg.TTL) >= w.cfg.MinExpiries {
				w.ended = time.Now()
				return
			}
			if ran >= w.cfg.MaxDuration {
				w.ended, w.short = time.Now(), true
				return
			}
		}
	})
}

// close ends the watcher if it still runs and returns how long the traffic
// ran and whether -max-duration cut it short.
func (w *window) close() (time.Duration, bool) {
	if w.cancel == nil {
		return 0, false // never opened
	}
	w.cancel()
	w.wg.Wait()
	return w.ended.Sub(w.began), w.short
}

// runInstances runs the instances as goroutines of this process, all
// starting together so the cold key meets the whole burst, until w stops them.
func runInstances(ctx context.Context, n int, spec instanceSpec, live *counters, w *window) (tally, error) {
	ins := make([]*instance, 0, n)
	defer func() {
		for _, in := range ins {
			in.close()
		}
	}()
	for range n {
		in, err := newInstance(ctx, spec, live)
		if err != nil {
			return tally{}, err
		}
		ins = append(ins, in)
	}
	start := make(chan struct{})
	tallies := make([]tally, n)
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Go(func() { tallies[i] = in.run(ctx, start, w.stop) })
	}
	close(start)
	w.open(ctx)
	wg.Wait()
	var total tally
	for _, t := range tallies {
		total.merge(t)
	}
	return total, ctx.Err()
}

// progress shows a live line on a terminal, or one line per strategy when
// stderr is a file or pipe. The returned stop ends it.
func progress(w io.Writer, strategy string, d time.Duration, live *counters) (stop func()) {
	began := time.Now()
	line := func() string {
		return fmt.Sprintf("%-13s %5.1fs of %v  requests %-8d db loads %d",
			strategy, time.Since(began).Seconds(), d, live.requests.Load(), live.loads.Load())
	}
	if !isTerminal(w) {
		return func() { fmt.Fprintln(w, line()) }
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K") // leave the terminal clean for the table
				return
			case <-t.C:
				fmt.Fprint(w, "\r\033[K"+line())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// report is the whole run and its verdict.
type report struct {
	cfg      config
	env      *env
	Results  []result
	OK       bool
	Verdict  string
	Problems []string
	// NearNotShown says why stampede-near served nothing from memory in
	// this run ("" when it did): its row then shows the Redis path only.
	NearNotShown string
}

func (r *report) get(strategy string) result {
	for _, x := range r.Results {
		if x.Strategy == strategy {
			return x
		}
	}
	return result{}
}

// judged says whether a strategy is the library's, whose loads per expiry
// the verdict checks.
func judged(strategy string) bool { return strategy == "stampede" || strategy == "stampede-near" }

// judge fails the run if the library loaded the key more than once in any
// expiry, if any request failed, or if the loader and the database disagree
// on the number of loads.
func (r *report) judge() {
	for _, x := range r.Results {
		if x.Errors > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: %d requests failed (first: %s)", x.Strategy, x.Errors, x.FirstError))
		}
		if x.DBLoadsServer >= 0 && x.DBLoadsServer != x.DBLoads {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: the loader counted %d loads but the database served %d finds", x.Strategy, x.DBLoads, x.DBLoadsServer))
		}
	}
	for _, x := range r.Results {
		if judged(x.Strategy) && x.MaxLoadsExpiry > 1 {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: %d loads for %d expiries (up to %d in one)", x.Strategy, x.DBLoads, x.Expiries, x.MaxLoadsExpiry))
		}
	}
	s, sn, n, l := r.get("stampede"), r.get("stampede-near"), r.get("naive"), r.get("local")
	r.NearNotShown = r.nearNotShown(sn)
	r.OK = len(r.Problems) == 0
	switch {
	case !r.OK:
		r.Verdict = "verdict: FAIL - " + strings.Join(r.Problems, "; ")
	case r.NearNotShown != "":
		// The run failed nothing, but one row is not what it is meant to
		// show: the verdict must not call it OK.
		r.Verdict = fmt.Sprintf("verdict: INCOMPLETE - stampede loaded the hot key once per expiry (loads %d = expiries %d); "+
			"stampede-near NOT SHOWN: %s; naive loaded it %.1f times per expiry, local %.1f; no request failed",
			s.DBLoads, s.Expiries, r.NearNotShown, n.LoadsPerExpiry, l.LoadsPerExpiry)
	default:
		r.Verdict = fmt.Sprintf("verdict: OK - stampede loaded the hot key once per expiry (loads %d = expiries %d), "+
			"stampede-near too (loads %d = expiries %d, %.2fx local's requests); "+
			"naive loaded it %.1f times per expiry, local %.1f; no request failed",
			s.DBLoads, s.Expiries, sn.DBLoads, sn.Expiries, ratio(sn.Requests, l.Requests), n.LoadsPerExpiry, l.LoadsPerExpiry)
	}
}

// nearNotShown says why stampede-near's near cache served no request from
// memory, or "" when it served some (or the strategy did not run).
func (r *report) nearNotShown(sn result) string {
	if sn.Requests == 0 || sn.NearHits > 0 {
		return ""
	}
	if r.env != nil && r.env.miniredis {
		return fmt.Sprintf("its near cache served 0 of %d requests from memory, because the embedded miniredis "+
			"has no client-side caching (install redis-server or set REDIS_ADDR to see it)", sn.Requests)
	}
	return fmt.Sprintf("its near cache served 0 of %d requests from memory: this Redis gave it no client-side "+
		"caching (CLIENT TRACKING needs Redis 6 or later and an ACL that allows it)", sn.Requests)
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func (r *report) writeJSON(w io.Writer) {
	enc := json.NewEncoder(w)
	for _, x := range r.Results {
		_ = enc.Encode(x)
	}
}

func (r *report) writeTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\trequests\tnear hits\tdb loads\tdb finds seen\texpiries\tloads/expiry\tredis cmds\tp50\tp99\tmax\terrors\t")
	for _, x := range r.Results {
		seen := "n/a"
		if x.DBLoadsServer >= 0 {
			seen = fmt.Sprint(x.DBLoadsServer)
		}
		near := "-"
		if x.Strategy == "stampede-near" {
			near = fmt.Sprint(x.NearHits)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%d\t%.2f\t%d\t%s\t%s\t%.0fms\t%d\t\n", x.Strategy, x.Requests, near, x.DBLoads, seen,
			x.Expiries, x.LoadsPerExpiry, x.RedisCmds, ms(x.P50ms), ms(x.P99ms), x.MaxMs, x.Errors)
	}
	_ = tw.Flush()

	fmt.Fprintln(w)
	fmt.Fprintln(w, "naive:    GET; on a miss, FindOne and SET. No coordination.")
	fmt.Fprintln(w, "local:    naive inside golang.org/x/sync/singleflight, per instance (what go-redis/cache Once does).")
	fmt.Fprintln(w, "stampede: this library's cache.GetOrLoad (singleflight, then one Redis lock across instances).")
	fmt.Fprintln(w, "stampede-near: stampede with WithNearCache(64 MB) and WithNearShared: hits are memory reads, dropped on")
	fmt.Fprintln(w, "          every write of the key by Redis client-side caching (near hits: requests served so).")
	if r.NearNotShown != "" {
		fmt.Fprintln(w, "          NOT SHOWN in this run: "+r.NearNotShown+".")
		fmt.Fprintln(w, "          Its row is the Redis path only: every read went to Redis.")
	}
	fmt.Fprintln(w, "db loads: FindOne calls counted by the loader; db finds seen: the database's own count of find")
	fmt.Fprintln(w, "          commands over the same interval (serverStatus metrics.commands.find.total).")
	fmt.Fprintln(w, "expiries: times the hot key was missing from Redis: the cold start, then each TTL expiry under traffic.")
	fmt.Fprintln(w, "          A load that starts before the latest load of its group ended + TTL is a duplicate of that miss.")
	fmt.Fprintln(w, "loads/expiry: db loads / expiries; 1.00 is the ideal.")
	if len(r.Results) > 0 && r.Results[0].RedisCmdsMethod == "client hook" {
		fmt.Fprintln(w, "redis cmds: counted by a go-redis hook on every client (miniredis has no INFO commandstats).")
	} else {
		fmt.Fprintln(w, "redis cmds: INFO commandstats delta on the server, commands inside Lua scripts included,")
		fmt.Fprintln(w, "          INFO, HELLO and PING left out. Sent by the clients (hook):", r.sentSummary())
	}
	fmt.Fprintln(w, "p50, p99, max: latency of one request (one read of the hot product) as its goroutine saw it.")
	for _, x := range r.Results {
		if x.CutShort {
			fmt.Fprintf(w, "note: %s ran %.0fs, the -max-duration, and saw %d of the %d expiries asked for (-min-expiries)\n",
				x.Strategy, x.DurationS, x.Expiries, r.cfg.MinExpiries)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, r.Verdict)
}

// ms formats a latency; a memory read (stampede-near's hits) is below the
// histogram's 1 µs unit and would otherwise print as 0.00ms.
func ms(v float64) string {
	if v < 0.01 {
		return "<0.01ms"
	}
	return fmt.Sprintf("%.2fms", v)
}

func (r *report) sentSummary() string {
	var parts []string
	for _, x := range r.Results {
		parts = append(parts, fmt.Sprintf("%s %d", x.Strategy, x.RedisCmdsSent))
	}
	return strings.Join(parts, ", ")
}
