#!/usr/bin/env bash
# upgrade-check.sh: read-after-write across a rolling upgrade, with real
# processes of two versions. TestMixedNearCacheAcrossProcesses runs its
# writer in the test process and its near-cache readers as child processes
# of os.Args[0]; `exec -a` runs one build's test with the other's children:
# an older writer with this build's readers, and this build's writer with
# older readers. Both must report 0 old reads.
#
#   REDIS_ADDR=127.0.0.1:6379 reliability/upgrade-check.sh [older commit, default 250a443]
set -euo pipefail
old=${1:-250a443}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/old" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add -q --detach "$work/old" "$old"
(cd "$work/old/reliability" && go test -race -c -o "$work/old.test" .)
(cd "$root/reliability" && go test -race -c -o "$work/new.test" .)
status=0
# The third pass: this build's readers strict per key (WithNearPerKey), as
# CHILD_PERKEY tells them, under an older writer.
for pair in "older writer, new readers:$work/new.test:$work/old.test:" "new writer, older readers:$work/old.test:$work/new.test:" "older writer, new per-key readers:$work/new.test:$work/old.test:true"; do
	IFS=: read -r name kids parent perkey <<<"$pair"
	echo "== $name"
	out=$(cd "$root/reliability" && CHILD_PERKEY=$perkey bash -c "exec -a '$kids' '$parent' -test.run 'TestMixedNearCacheAcrossProcesses/(none|stop)$' -test.v -test.count=1" 2>&1) || status=1
	grep -E "near hits|^(--- |PASS|FAIL)" <<<"$out" || true
done
exit $status
