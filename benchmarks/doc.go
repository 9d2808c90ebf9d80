// Package benchmarks compares the stampede cache with other ways of putting
// Redis in front of a slow source of truth, in one process, on one private
// redis-server, so every figure is read as a ratio between competitors.
//
// Everything lives in _test.go files so that the competitors (go-redis/cache,
// rueidis, redislock) never enter the import graph of the cache package or
// of a program that uses it. Run:
//
//	go test -run '^$' -bench . ./benchmarks/
//	./benchmarks/run.sh 5   # -count 5 plus benchstat, results in benchmarks/results/
//
// The benchmarks:
//
//   - BenchmarkHit: a warm key read with b.RunParallel, one hot key and a
//     spread over 10k keys, with a Background and a cancellable context;
//     ns/op, B/op, allocs/op. hit-before-after.sh runs it against an older
//     commit in the same session.
//   - BenchmarkStampede: one op is one cold key asked for at the same moment
//     by inst instances (each its own client and cache object, standing in
//     for processes) times g goroutines, with a 20ms loader; loads/op,
//     redis-cmds/op, redis-scripts/op, p50-ms, p99-ms, errors/op.
//   - BenchmarkExpiry: steady load on a hot key whose 1s TTL runs out again
//     and again; one op is one expiry; loads/expiry, p99-ms, errors/op.
//   - BenchmarkRefresh (stampede only): the same traffic with early refresh
//     on and off, TTLs of 250ms, 1s and 2s; one op is one TTL (run with
//     -benchtime 3x); loads/ttl, slow/ttl (reads over 10ms), p99.9-ms.
//   - BenchmarkStale (stampede only): the database fails for 2s while a
//     hot key's 200ms TTL runs out, with WithStale; one op is one outage
//     (run with -benchtime 1x); stale-%, loads/throttle, errors/op.
//   - BenchmarkBatch (stampede only): 100 keys, 10 cold, through one
//     GetOrLoadMany or 100 parallel GetOrLoad calls; ns/op,
//     round-trips/op, redis-cmds/op, loads/op.
//
// TestCompetitors checks on every CI run that each adapter still loads and
// returns the right value.
package benchmarks
