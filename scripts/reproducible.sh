#!/usr/bin/env bash
# Checks that the release build is reproducible: HEAD's release binary
# (make release) is built in two clones of this repository, at paths of
# different lengths and at different times, and the two must be the same
# bytes. Neither may hold a path of the machine that built it (the clones,
# the module cache, GOROOT), and its stamp must name HEAD and HEAD's commit
# time. Only committed work is built: a clone checks out HEAD as committed.
#
# FRESH_CACHE=1 builds the second clone with an empty build cache, so that
# every package is compiled again rather than taken from the first build's
# cache (minutes instead of seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
root=$PWD
head=$(git rev-parse HEAD)
epoch=$(git log -1 --format=%ct "$head")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
first=$work/a
second=$work/second/clone/at/a/longer/path
for dir in "$first" "$second"; do
	git clone -q --no-checkout "$root" "$dir"
	git -C "$dir" -c advice.detachedHead=false checkout -q "$head"
done

# The caller's SOURCE_DATE_EPOCH (an exported one of an outer make) must
# not stand in for the clones' own commit time.
unset SOURCE_DATE_EPOCH VERSION COMMIT DIRTY
make -s -C "$first" release GO="$GO"
if [ "${FRESH_CACHE:-}" = 1 ]; then
	GOCACHE=$work/gocache make -s -C "$second" release GO="$GO"
else
	make -s -C "$second" release GO="$GO"
fi

fail=0
sum1=$(sha256sum <"$first/dist/csisupd" | cut -d' ' -f1)
sum2=$(sha256sum <"$second/dist/csisupd" | cut -d' ' -f1)
if [ "$sum1" != "$sum2" ]; then
	echo "reproducible: two release builds of $head differ: $sum1 and $sum2"
	fail=1
fi
for path in "$work" "$root" "$($GO env GOMODCACHE)" "$($GO env GOROOT)" "$($GO env GOCACHE)"; do
	if grep -qaF "$path" "$first/dist/csisupd"; then
		echo "reproducible: the release binary holds the builder's path $path"
		fail=1
	fi
done
want=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
got=$("$first/dist/csisupd" version --json)
for field in "\"commit\": \"$head\"" "\"build_time\": \"$want\"" '"dirty": false'; do
	if ! grep -qF "$field" <<<"$got"; then
		echo "reproducible: version --json of the release binary lacks $field:"
		echo "$got"
		fail=1
	fi
done
[ "$fail" = 0 ] && echo "reproducible: two release builds of $head are the same bytes, sha256 $sum1"
exit "$fail"
