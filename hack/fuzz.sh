#!/usr/bin/env bash
# Runs every fuzz target of the module (func Fuzz* in a _test.go file) for FUZZTIME each, one at
# a time with FUZZ_PARALLEL workers, and prints a line per target: executions, new inputs, and
# the result. A failing input is saved by go test under the package's testdata/fuzz/, where
# `go test` replays it from then on: commit it with the fix.
# Environment: FUZZTIME (5m), FUZZ_PARALLEL (1), FUZZ_MATCH (a regexp of target names, all by default),
# FUZZ_SUMMARY (a file the summary is also written to).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fuzztime=${FUZZTIME:-5m}
parallel=${FUZZ_PARALLEL:-1}
match=${FUZZ_MATCH:-.}
summary=()
failed=0
for dir in $(grep -rl --include='*_test.go' '^func Fuzz' internal cmd | xargs -n1 dirname | sort -u); do
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go | sed 's/^func //' | sort -u); do
    [[ $target =~ $match ]] || continue
    echo "==> $dir $target for $fuzztime" >&2
    log=$(mktemp)
    go test "./$dir" -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" -parallel "$parallel" 2>&1 | tee "$log" | grep -v '^fuzz: elapsed' >&2
    status=${PIPESTATUS[0]}
    last=$(grep '^fuzz: elapsed' "$log" | tail -1 | sed 's/^fuzz: //')
    result=ok
    if [ "$status" -ne 0 ]; then result=FAILED; failed=1; fi
    summary+=("$(printf '%-32s %-6s %s' "$dir.$target" "$result" "$last")")
    rm -f "$log"
  done
done
printf '%s\n' "${summary[@]}" | tee ${FUZZ_SUMMARY:+"$FUZZ_SUMMARY"}
exit $failed
