#!/usr/bin/env bash
# The benchmarks of make bench, and make bench-compare.
#
#   scripts/bench.sh run FILE   run every benchmark; the output is shown and
#                               written to FILE; one that fails does not
#                               stop the others
#   scripts/bench.sh compare    run every benchmark of the commit BASE and of
#                               the working tree, paired, then print each
#                               figure of both and their ratio
#
# compare extracts BASE with git archive into a temporary directory, then
# runs each line of BENCHES there and here in turn, COUNT times, swapping
# which goes first each time (ABBA), so that what drifts on the machine
# during the run weighs on both alike. The outputs are kept in
# bench-base.out and bench-new.out; scripts/benchtable compares them. A
# package or figure that BASE lacks is "-" there; a run that fails on one
# side is reported and its figures are "-".
#
# Environment: GO (default go); BENCH, a regular expression: only the lines
# of BENCHES that match it (say BENCH=statepb); DRY_RUN=1 prints the
# commands instead of running them. compare only: BASE, the commit
# (required); COUNT, the runs of each side (default 1); NOISE, the percent
# by which a figure may be worse before it is marked (default 10);
# STRICT=1 fails (exit status 3) when one is.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BENCH=${BENCH:-}
DRY_RUN=${DRY_RUN:-}

# BENCHES: one go test run a line: package, -bench pattern, -benchtime,
# -timeout. The figures are each reported beside the direct path measured in
# the same run (see docs/performance.md). Each benchmark of test/bench runs in
# a process of its own, so that none is measured in what an earlier one left
# in its process (LeaseRenewals1000 leaves some 240 MiB of heap spans behind,
# and the node agent's latencies are measured in-process). A benchmark added
# to test/bench needs a line here.
BENCHES='./test/bench/ Cluster10000 1x 30m
./test/bench/ LeaseRenewals1000 1x 30m
./test/bench/ NodeAgent 1x 10m
./test/bench/ SteadyState1000 1x 30m
./internal/rpc/ ClientCSIValidateVolume 3s 10m
./internal/rpc/ EventLatencyStalledSubscribers 1x 10m
./internal/consulsync/ . 3x 10m
./internal/server/ PluginUpdates 50000x 10m
./internal/server/ NodeHeartbeatAt10000Nodes 50000x 10m
./internal/server/ ClaimRelease 50x 10m
./internal/server/ SnapshotAndExpand 50x 10m
./internal/server/statepb/ NodePageToAPI 2s 10m
./internal/registry/ PluginSources 20x 10m'

selected=$(grep -E -- "${BENCH:-.}" <<<"$BENCHES" || true)
if [ -z "$selected" ]; then
	echo "bench: BENCH=$BENCH matches none of:" >&2
	echo "$BENCHES" >&2
	exit 2
fi

# bench DIR OUT PKG PATTERN BENCHTIME TIMEOUT runs one line of BENCHES in the
# tree DIR, appending its output to OUT.
bench() {
	local dir=$1 out=$2 pkg=$3 pattern=$4 benchtime=$5 timeout=$6
	local cmd=("$GO" test -run '^$' -bench "$pattern" -benchtime "$benchtime" -count 1 -timeout "$timeout" "$pkg")
	local shown
	shown=$(printf '%q ' "${cmd[@]}")
	if [ "$dir" != . ]; then
		shown="(cd $dir && ${shown% })"
	fi
	echo "${shown% } >> $out"
	if [ -n "$DRY_RUN" ]; then
		return 0
	fi
	(cd "$dir" && "${cmd[@]}") 2>&1 | tee -a "$out"
}

run() {
	local out=${1:?usage: bench.sh run FILE}
	[ -n "$DRY_RUN" ] || rm -f "$out"
	local failed=()
	while read -r pkg pattern benchtime timeout; do
		bench . "$out" "$pkg" "$pattern" "$benchtime" "$timeout" || failed+=("$pkg $pattern")
	done <<<"$selected"
	if ((${#failed[@]} > 0)); then
		printf 'bench: failed: %s\n' "${failed[@]}" >&2
		return 1
	fi
}

compare() {
	local base=${BASE:?compare: set BASE to the commit to compare with}
	local count=${COUNT:-1} noise=${NOISE:-10}
	local rev
	rev=$(git rev-parse --verify --quiet "$base^{commit}") || { echo "bench: BASE=$base is no commit" >&2; exit 2; }
	local baseout=$PWD/bench-base.out newout=$PWD/bench-new.out
	work=$(mktemp -d) # global: the trap runs after compare returns
	trap 'rm -rf "$work"' EXIT
	echo "git archive $rev | tar -x -C $work/base"
	if [ -z "$DRY_RUN" ]; then
		mkdir "$work/base"
		git archive "$rev" | tar -x -C "$work/base"
		rm -f "$baseout" "$newout"
	fi
	# Each side builds the binaries its tests start.
	unset CSISUPD_TEST_BINDIR
	local failed=0 i
	while read -r pkg pattern benchtime timeout; do
		for ((i = 1; i <= count; i++)); do
			local sides=(base new)
			if ((i % 2 == 0)); then
				sides=(new base)
			fi
			for side in "${sides[@]}"; do
				if [ "$side" = base ]; then
					if [ -z "$DRY_RUN" ] && [ ! -d "$work/base/$pkg" ]; then
						echo "bench: $BASE has no $pkg: its figures are -" >&2
						continue
					fi
					bench "$work/base" "$baseout" "$pkg" "$pattern" "$benchtime" "$timeout" ||
						echo "bench: $pkg $pattern failed at $BASE: its figures are -" >&2
				else
					bench . "$newout" "$pkg" "$pattern" "$benchtime" "$timeout" || {
						echo "bench: $pkg $pattern failed in the working tree: its figures are -" >&2
						failed=1
					}
				fi
			done
		done
	done <<<"$selected"
	local cmp=("$GO" run ./scripts/benchtable compare -noise "$noise")
	if [ -n "${STRICT:-}" ]; then
		cmp+=(-strict)
	fi
	cmp+=("$baseout" "$newout")
	echo "${cmp[*]}"
	if [ -n "$DRY_RUN" ]; then
		return 0
	fi
	echo "base: $BASE ($rev); new: the working tree; $count run(s) each"
	"${cmp[@]}"
	return "$failed"
}

case ${1:-} in
run) run "${2:-}" ;;
compare) compare ;;
*)
	echo "usage: scripts/bench.sh run FILE | compare" >&2
	exit 2
	;;
esac
