# Makefile: shortcuts; the README commands work without make. The repository
# is five modules tied by go.work: "./..." alone stops at the root module, so
# the targets name every module ("work" is all packages of all of them).
.PHONY: test demo bench lint tidy fuzz ci

# test is the README's test command, exactly.
test:
	go test -race -p=4 -vet=off ./reliability/... ./... ./examples/... ./benchmarks/... ./otel/...

demo:
	go run ./examples/hotkey

bench:
	./benchmarks/run.sh

lint:
	go vet work
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 work

tidy:
	for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && go mod tidy) || exit 1; done

fuzz:
	go test -run '^$$' -fuzz FuzzDecodeRecord -fuzztime 60s ./internal/record

ci:
	bash .ci/run
