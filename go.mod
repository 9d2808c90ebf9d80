module github.com/stampede-go/stampede

go 1.25.0

require (
	github.com/maypok86/otter/v2 v2.4.0
	github.com/redis/go-redis/v9 v9.5.5
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.10.0
)

require (
	github.com/cespare/xxhash/v2 v2.2.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
