#!/usr/bin/env bash
# hit-before-after.sh measures BenchmarkHit (raw and stampede) at an older
# commit and at the current tree in one session, alternating the two so that
# both see the same machine, and summarises them with benchstat (issue 10).
#
#   benchmarks/hit-before-after.sh c9b2391 [rounds=2] [count per round=3]
#
# The old commit is checked out in a temporary git worktree outside the
# repository and removed afterwards. Its benchmark names (Hit/raw/hot) are
# rewritten to today's (Hit/impl=raw/ctx=background/keys=hot; the old code
# only had a Background context) in hit-before-STAMP.txt so benchstat can
# pair them; the untouched output is kept as hit-before-raw-STAMP.txt.
set -euo pipefail

rev="${1:?usage: hit-before-after.sh <commit> [rounds] [count]}"
rounds="${2:-2}"
count="${3:-3}"
cd "$(dirname "$0")/.."
repo="$(pwd)"
out="$repo/benchmarks/results"
mkdir -p "$out"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
wt="$(mktemp -d /tmp/stampede-hit-before.XXXXXX)"
rmdir "$wt"
git worktree add --detach "$wt" "$rev" >/dev/null
trap 'git -C "$repo" worktree remove --force "$wt"' EXIT

bin="$(mktemp -d)"
(cd "$wt" && go test -c -o "$bin/before.test" ./benchmarks/)
go test -c -o "$bin/after.test" ./benchmarks/

meta="$out/hit-meta-$stamp.txt"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "before: $(git rev-parse "$rev") -test.bench 'Hit/(raw|stampede)/' -test.count $count"
	echo "after: $(git rev-parse HEAD) + working tree of benchmarks/ -test.bench 'Hit/impl=(raw|stampede)/' -test.count $count"
	echo "rounds: $rounds (before, after, before, after, ...)"
	# The after binary is built from the working tree: name what in it was
	# not committed (others' edits in progress included).
	echo "after-uncommitted: $(git status --porcelain --untracked-files=no | tr '\n' ' ')"
	echo "go: $(go version)"
	echo "redis-server: $(redis-server --version)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "cores: $(nproc)"
	echo "loadavg-before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$meta"

rawbefore="$out/hit-before-raw-$stamp.txt"
after="$out/hit-after-$stamp.txt"
: >"$rawbefore"
: >"$after"
for r in $(seq "$rounds"); do
	echo "loadavg-round$r-before: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
	(cd "$wt/benchmarks" && "$bin/before.test" -test.run '^$' -test.bench 'Hit/(raw|stampede)/' -test.count "$count") | tee -a "$rawbefore"
	echo "loadavg-round$r-after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
	(cd benchmarks && "$bin/after.test" -test.run '^$' -test.bench 'Hit/impl=(raw|stampede)/' -test.count "$count") | tee -a "$after"
done
echo "loadavg-end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"

before="$out/hit-before-$stamp.txt"
sed -E 's#^BenchmarkHit/([^/]+)/(hot|spread10k)#BenchmarkHit/impl=\1/ctx=background/keys=\2#' "$rawbefore" >"$before"

stat="$out/hit-benchstat-$stamp.txt"
bs() { go run golang.org/x/perf/cmd/benchstat@latest "$@"; }
{
	echo "## before ($rev): stampede against raw in the same run"
	bs -col /impl "$before"
	echo
	echo "## after (HEAD): stampede against raw in the same run"
	bs -col /impl "$after"
	echo
	echo "## before against after, each competitor"
	bs before="$before" after="$after"
} >"$stat"
cat "$stat"
rm -rf "$bin"
echo "results in $out/hit-*-$stamp.txt"
