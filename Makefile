# Makefile: shortcuts; the README commands work without make.
.PHONY: test demo bench lint fuzz ci

test:
	go test -race ./...

demo:
	go run ./examples/hotkey

bench:
	./benchmarks/run.sh

lint:
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fuzz:
	go test -run '^$$' -fuzz FuzzDecodeRecord -fuzztime 60s ./cache

ci:
	bash .ci/run
