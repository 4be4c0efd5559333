#!/usr/bin/env bash
# Runs every fuzz target of the repository for FUZZTIME each (default 20s).
# Targets are listed with `go test -list '^Fuzz'` in each package whose tests
# declare one, so a new target is picked up without a change here.
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

for dir in $(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); do
	for target in $($GO test -list '^Fuzz' "$dir" | grep '^Fuzz' || true); do
		for attempt in 1 2 3; do
			echo "== $dir $target for $FUZZTIME (attempt $attempt)"
			log=$(mktemp)
			if $GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$dir" 2>&1 | tee "$log"; then
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
