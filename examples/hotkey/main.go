// Command hotkey is the flash-sale demo: one hot product whose cache entry is
// cold and keeps expiring, served by several instances, with four caching
// strategies compared on the same workload.
//
//	go run ./examples/hotkey            # about 40s once built
//	go run ./examples/hotkey -procs 4   # instances as 4 OS processes
//	go run ./examples/hotkey -json      # one JSON object per strategy
//	go run ./examples/hotkey -metrics   # and the caches' OpenTelemetry figures
//
// It runs against a redis-server from PATH, started on a free port and
// stopped at the end (else an embedded miniredis, on which the near cache
// cannot serve: the verdict then says so), and an embedded MongoDB
// (FerretDB). REDIS_ADDR and MONGO_URI point it at servers of your own.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"
)

// config is one run of the demo; main fills it from flags and environment,
// the test fills it directly.
type config struct {
	Instances   int           // service instances, each with its own Redis client and cache
	Goroutines  int           // request goroutines per instance
	Duration    time.Duration // traffic per strategy, at least
	MinExpiries int           // stampede's traffic goes on past Duration until the hot key has been missing this many times...
	MaxDuration time.Duration // ...but no longer than this
	TTL         time.Duration // TTL of the hot key
	LoadDelay   time.Duration // added to every database load: a heavy query
	Procs       int           // >0: run the instances as this many OS processes
	Products    int           // products seeded into the embedded database
	JSON        bool          // one JSON object per strategy on stdout
	Metrics     bool          // the OpenTelemetry adapter on the stampede caches, figures printed at the end
	Verbose     bool          // server logs on stderr
	RedisAddr   string        // "" starts a redis-server from PATH, else an embedded miniredis
	MongoURI    string        // "" starts an embedded FerretDB
}

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec)) // re-executed by the parent for -procs
	}
	cfg := config{RedisAddr: os.Getenv("REDIS_ADDR"), MongoURI: os.Getenv("MONGO_URI")}
	flag.IntVar(&cfg.Instances, "instances", 4, "service instances (each with its own Redis client, cache and MongoDB client)")
	flag.IntVar(&cfg.Goroutines, "goroutines", 32, "request goroutines per instance")
	flag.DurationVar(&cfg.Duration, "duration", 8*time.Second, "traffic per strategy, at least")
	flag.IntVar(&cfg.MinExpiries, "min-expiries", 2, "after -duration, run the stampede strategy on until the hot key has been missing `N` times (the cold start counts)")
	flag.DurationVar(&cfg.MaxDuration, "max-duration", 0, "traffic per strategy, at most, while waiting for -min-expiries (default 10 x -duration)")
	flag.DurationVar(&cfg.TTL, "ttl", time.Second, "TTL of the hot key (short, so it expires several times per run)")
	flag.DurationVar(&cfg.LoadDelay, "load-delay", 100*time.Millisecond, "delay added to every database load, modelling a heavy query")
	flag.IntVar(&cfg.Procs, "procs", 0, "run the instances as `N` OS processes, one instance each (replaces -instances)")
	flag.IntVar(&cfg.Products, "products", 5000, "products seeded into the embedded database")
	flag.BoolVar(&cfg.JSON, "json", false, "print one JSON object per strategy on its own line")
	flag.BoolVar(&cfg.Verbose, "v", false, "show server logs")
	flag.BoolVar(&cfg.Metrics, "metrics", false, "record the stampede caches' events with the OpenTelemetry adapter and print the figures at the end")
	flag.Parse()
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "hotkey:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, cfg, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hotkey:", err)
		os.Exit(1)
	}
	if !rep.OK {
		os.Exit(1)
	}
}

func (c *config) check() error {
	if c.Procs > 0 {
		c.Instances = c.Procs
	}
	switch {
	case c.Instances < 1 || c.Goroutines < 1:
		return fmt.Errorf("-instances and -goroutines must be at least 1")
	case c.Duration <= 0 || c.TTL < time.Millisecond || c.LoadDelay < 0:
		return fmt.Errorf("-duration and -ttl must be positive, -load-delay not negative")
	case c.MinExpiries < 0 || c.MaxDuration < 0:
		return fmt.Errorf("-min-expiries and -max-duration must not be negative")
	case c.Products < 1:
		return fmt.Errorf("-products must be at least 1")
	case c.Metrics && c.Procs > 0:
		return fmt.Errorf("-metrics reads the caches of this process; it cannot be combined with -procs")
	}
	if c.MaxDuration == 0 {
		c.MaxDuration = 10 * c.Duration
	}
	if c.MaxDuration < c.Duration {
		return fmt.Errorf("-max-duration (%v) must be at least -duration (%v)", c.MaxDuration, c.Duration)
	}
	return nil
}

// run sets up the servers, runs the strategies one after another and
// writes the table (or JSON lines) to out and progress to errw.
func run(ctx context.Context, cfg config, out, errw io.Writer) (*report, error) {
	info := out
	if cfg.JSON {
		info = errw // keep stdout to JSON lines
	}
	e, err := setup(ctx, cfg, errw)
	if err != nil {
		return nil, err
	}
	defer e.close()
	mode := "goroutines in this process"
	if cfg.Procs > 0 {
		mode = fmt.Sprintf("%d OS processes", cfg.Procs)
	}
	fmt.Fprintf(info, "hotkey: Redis = %s; MongoDB = %s\n", e.redisDesc, e.mongoDesc)
	fmt.Fprintf(info, "%d products seeded; hot key %s; %d instances (%s) x %d goroutines; "+
		"%v per strategy (longer until %d expiries, at most %v); TTL %v; load delay %v\n\n",
		cfg.Products, hotKey(e.runID, "<strategy>"), cfg.Instances, mode, cfg.Goroutines,
		cfg.Duration, cfg.MinExpiries, cfg.MaxDuration, cfg.TTL, cfg.LoadDelay)

	var m *metrics
	if cfg.Metrics {
		if m, err = startMetrics(); err != nil {
			return nil, err
		}
		defer m.stop()
	}
	rep := &report{cfg: cfg, env: e}
	for _, s := range strategies {
		r, err := measure(ctx, cfg, e, s, errw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
		rep.Results = append(rep.Results, r)
	}
	rep.judge()
	if cfg.JSON {
		rep.writeJSON(out)
		fmt.Fprintln(errw, rep.Verdict)
	} else {
		rep.writeTable(out)
	}
	if m != nil {
		if err := m.write(ctx, info); err != nil {
			return nil, err
		}
	}
	return rep, nil
}
