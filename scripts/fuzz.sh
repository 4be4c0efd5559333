#!/usr/bin/env bash
# Runs every fuzz target of the repository for FUZZTIME each (default 20s).
# Targets are listed by each package's test binary (-test.list '^Fuzz'), in
# each package whose tests declare one, so a new target is picked up without
# a change here.
#
# Each package's test binary is built once, with the fuzzing instrumentation
# (go test -c -fuzz), and run once per target in the package's directory, as
# go test would run it, with go's fuzz cache of the package
# ($GOCACHE/fuzz/<import path>): the corpus found before is used again and a
# failing input is written to testdata/fuzz/<target>/ for go test to replay.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" at the end of a duration budget without having found anything
# (golang/go#75804, fixed in Go 1.27). Such a run is tried again, at most
# twice; a real finding always writes a failing input first ("Failing input
# written to"), and fails at once.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20s}

bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT
cache=$($GO env GOCACHE)/fuzz

for dir in $(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); do
	pkg=$($GO list "$dir")
	bin="$bins/$(echo "$pkg" | tr / _).test"
	echo "== $dir: building its fuzz test binary"
	$GO test -c -fuzz . -o "$bin" "$dir"
	for target in $(cd "$dir" && "$bin" -test.list '^Fuzz' | grep '^Fuzz' || true); do
		for attempt in 1 2 3; do
			echo "== $dir $target for $FUZZTIME (attempt $attempt)"
			log=$(mktemp)
			if (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "$FUZZTIME" \
				-test.fuzzcachedir "$cache/$pkg" -test.timeout 10m) 2>&1 | tee "$log"; then
				rm -f "$log"
				break
			fi
			if grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log" && [ "$attempt" -lt 3 ]; then
				echo "== $target: the fuzz coordinator's deadline race (golang/go#75804), no finding; trying again"
				rm -f "$log"
				continue
			fi
			rm -f "$log"
			echo "== $target failed" >&2
			exit 1
		done
	done
done
