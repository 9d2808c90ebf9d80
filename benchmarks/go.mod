module github.com/stampede-go/stampede/benchmarks

go 1.26.0

require (
	github.com/bsm/redislock v0.9.4
	github.com/go-redis/cache/v9 v9.0.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.78
	github.com/redis/rueidis/rueidisaside v1.0.78
	github.com/stampede-go/stampede v0.0.0-00010101000000-000000000000
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.18.6 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/vmihailenco/go-tinylfu v0.2.2 // indirect
	github.com/vmihailenco/msgpack/v5 v5.3.4 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// The root module is not released yet; in this repository go.work also
// points at it.
replace github.com/stampede-go/stampede => ../
