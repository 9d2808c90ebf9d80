#!/usr/bin/env bash
# run.sh runs the comparison benchmarks -count times (default 5) and
# summarises them with benchstat, writing everything to benchmarks/results/.
#
#   benchmarks/run.sh            # -count 5, all benchmarks
#   benchmarks/run.sh 10         # -count 10
#   benchmarks/run.sh 5 -bench 'Hit'   # extra arguments go to go test
#   ROUNDS=6 benchmarks/run.sh 1 -bench 'Refresh' -benchtime 3x
#                                # go test -count 1 six times: every
#                                # sub-benchmark once per round, so a
#                                # control and what it controls see the
#                                # same moments of a busy machine
#
# Files written (STAMP is the UTC start time):
#   bench-STAMP.txt      raw go test output, the input benchstat needs
#   benchstat-STAMP.txt  medians with 95% confidence intervals
#   meta-STAMP.txt       machine, versions and load average before and after
# and latest-*.txt copies of the three, which BENCHMARKS.md quotes.
set -euo pipefail

count="${1:-5}"
rounds="${ROUNDS:-1}"
shift || true
cd "$(dirname "$0")/.."
out=benchmarks/results
mkdir -p "$out"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
raw="$out/bench-$stamp.txt"
stat="$out/benchstat-$stamp.txt"
meta="$out/meta-$stamp.txt"

bench=(-bench .)
if [ "$#" -gt 0 ]; then
	bench=("$@")
fi

# The numbers only mean something next to the machine they came from; the
# load average says whether something else was competing for the cores.
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "command: go test -run '^\$' ${bench[*]} -count $count -timeout 60m ./benchmarks/ ($rounds time(s))"
	echo "go: $(go version)"
	echo "redis-server: $(redis-server --version)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "cores: $(nproc)"
	echo "kernel: $(uname -sr)"
	echo "commit: $(git rev-parse HEAD)"
	# go test builds the working tree: name what in it was not committed.
	echo "uncommitted: $(git status --porcelain --untracked-files=no | tr '\n' ' ')"
	echo "loadavg-before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$meta"

: >"$raw"
for r in $(seq "$rounds"); do
	if [ "$rounds" -gt 1 ]; then
		echo "loadavg-round$r: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
	fi
	go test -run '^$' "${bench[@]}" -count "$count" -timeout 60m ./benchmarks/ | tee -a "$raw"
done

echo "loadavg-after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"

# benchstat is fetched through the Go module proxy like any module.
go run golang.org/x/perf/cmd/benchstat@latest "$raw" >"$stat"
cat "$stat"

cp "$raw" "$out/latest-bench.txt"
cp "$stat" "$out/latest-benchstat.txt"
cp "$meta" "$out/latest-meta.txt"
echo "results in $out (latest-*.txt)"
