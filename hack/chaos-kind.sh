#!/usr/bin/env bash
# Runs the reliability suites and writes their figures into docs/reliability.md, as the page's
# latest run (the run it replaces goes to docs/reports/reliability-history.md):
#   1. test/reliability against envtest (bad input, documents edited by hand, least privilege,
#      credentials in the operator's log and Events);
#   2. test/chaos on kind cluster KIND_CLUSTER (tsingress-chaos by default), the operator deployed
#      and the local tailnet up as hack/kind-deploy.sh does it: the operator killed while objects
#      churn, proxy Pods deleted, replicas deleted and evicted under load, the API server and the
#      tailnet's control server down, documents corrupted under load, and the credential search
#      over every log and Event.
# The fuzzing figures come from the last `make fuzz` (bin/fuzz-summary.txt), when there is one.
# With CHAOS_CI=1 (make chaos-ci) it runs only the kind suite, as CHAOS_ARGS focus it, prints its
# figures and writes no page: CI runs it on the e2e cluster, after the e2e suite.
# Environment: KIND_CLUSTER, IMG_OPERATOR, IMG_PROXY, VERSION, KUSTOMIZE, INSTALL, HELM, ENVTEST_ASSETS, CHAOS_ARGS,
# CHAOS_POD_DELETIONS, CHAOS_OPERATOR_KILLS, CHAOS_OBJECTS, CHAOS_CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export KIND_CLUSTER=${KIND_CLUSTER:-tsingress-chaos}
started=$(date +%s)
out=$root/bin/reliability
rm -rf "$out"
mkdir -p "$out/logs"

source "$root/hack/lib.sh"
ci=${CHAOS_CI:-0}
envtest_status=0
if [ "$ci" != 1 ]; then
  stage "test/reliability against envtest"
  set +e
  KUBEBUILDER_ASSETS=${ENVTEST_ASSETS:-$root/bin/envtest} KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=120s \
    RELIABILITY_REPORT=$out/envtest.md go test ./test/reliability/ -count=1 -timeout 15m
  envtest_status=$?
  set -e
  done_stage
  [ -f "$out/envtest.md" ] || echo "test/reliability wrote no figures (exit status $envtest_status)." > "$out/envtest.md"
fi

# hack/kind-deploy.sh lifts Let's Encrypt's limits for the local CA, which has none.
source "$root/hack/kind-deploy.sh"

stage "test/chaos on kind cluster $KIND_CLUSTER"
set +e
counts="CHAOS_OPERATOR_KILLS=${CHAOS_OPERATOR_KILLS:-50} CHAOS_OBJECTS=${CHAOS_OBJECTS:-30} CHAOS_POD_DELETIONS=${CHAOS_POD_DELETIONS:-20}"
KUBECTL=$root/bin/kubectl CHAOS_REPORT=$out/chaos.md CHAOS_LOG_DIR=$out/logs \
  go test -tags chaos ./test/chaos/ -count=1 -timeout "${CHAOS_GO_TIMEOUT:-60m}" -v ${CHAOS_ARGS:--ginkgo.v} 2>&1 | tee "$out/chaos.log"
status=${PIPESTATUS[0]}
set -e
done_stage
# The figures are written whatever the outcome, with the outcome: a failed goal is a figure too.
failed_specs=$(sed 's/\x1b\[[0-9;]*m//g' "$out/chaos.log" | grep -E '^\s*\[(FAIL|PANICKED)\] ' | sed 's/^\s*//' | sort -u || true)
[ -f "$out/chaos.md" ] || echo "The suite wrote no figures (exit status $status): see the run's output." > "$out/chaos.md"
if [ "$ci" = 1 ]; then
  cat "$out/chaos.md"
  echo "chaos (CI): $(( $(date +%s) - started ))s, suite exit status $status" >&2
  exit $status
fi

stage "writing docs/reliability.md"
# docs/reliability.md is written by hand except for one marked section, the latest run, which this
# replaces; the run it replaces goes to the top of docs/reports/reliability-history.md, so that the
# page states what is true now and the previous run stays at hand (tools/bench does the same for
# docs/performance.md). The suites' own sections go one heading level down, under the run's.
page=$root/docs/reliability.md
history=$root/docs/reports/reliability-history.md
run_begin='<!-- make chaos: begin the run of '
run_end='<!-- make chaos: end of the run -->'
history_mark='<!-- make chaos puts the run it replaces below this line, newest first -->'
label="$(date -u -d @"$started" '+%Y-%m-%d %H:%M UTC'), $(git -C "$root" describe --always --dirty)"
section=$out/section.md
{
  cat <<MD
- Run: \`make chaos\` at $(git -C "$root" describe --always --dirty), started $(date -u -d @"$started" '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - started ))s in all,
  on a machine with $(nproc) cores; $counts (the issue's counts are the defaults), kind node $(docker exec "$KIND_CLUSTER-control-plane" kubelet --version 2>/dev/null | awk '{print $2}').

### On a kind cluster (test/chaos)

Outcome: $(if [ "$status" -eq 0 ]; then echo "every spec passed."; else echo "exit status $status; the failed specs, whose figures below miss their goals:"; fi)
MD
  if [ -n "$failed_specs" ]; then
    echo
    printf '%s\n' "$failed_specs" | sed 's/^/- /'
  fi
  echo
  sed -E 's/^(#+) /#\1 /' "$out/chaos.md"
  printf '\n### Against envtest (test/reliability)\n\n'
  if [ "$envtest_status" -eq 0 ]; then echo 'Outcome: every spec passed.'; else echo "Outcome: exit status $envtest_status (see the run's output)."; fi
  echo
  sed -E 's/^(#+) /#\1 /' "$out/envtest.md"
  printf '\n### Fuzzing\n\n'
  if [ -f "$root/bin/fuzz-summary.txt" ]; then
    echo "From \`make fuzz\` on $(date -u -r "$root/bin/fuzz-summary.txt" +%Y-%m-%d): each target, its executions and the inputs that found new code:"
    echo
    echo '```'
    cat "$root/bin/fuzz-summary.txt"
    echo '```'
  else
    echo 'No `make fuzz` summary on this machine (`bin/fuzz-summary.txt`): see docs/reports/reliability-history.md for the last recorded.'
  fi
} > "$section"
# The page with the new section in place of the old one (at the end under "## The latest run" when
# it has none); the old one, headed by its label, into $out/replaced.md.
[ -f "$page" ] || printf '# Reliability\n' > "$page"
awk -v begin="$run_begin" -v end="$run_end" -v label="$label" -v section="$section" -v replaced="$out/replaced.md" '
  # Blank lines around the section, so that neither marker runs into a table or a list.
  function put() { print begin label " -->"; print ""; while ((getline l < section) > 0) print l; print ""; print end }
  !done && index($0, begin) == 1 {
    old = substr($0, length(begin) + 1); sub(/ -->$/, "", old)
    printf "## The run of %s\n\n", old > replaced
    inside = 1; started = 0; next
  }
  inside && $0 == end { put(); inside = 0; done = 1; next }
  inside && (started || $0 != "") { started = 1; print > replaced; next }
  inside { next }
  { print }
  END {
    if (inside) { print "reliability.md: the run'"'"'s section does not end" > "/dev/stderr"; exit 1 }
    if (!done) { print ""; print "## The latest run"; print ""; put() }
  }' "$page" > "$out/page.md"
if [ -s "$out/replaced.md" ]; then
  mkdir -p "$(dirname "$history")"
  [ -f "$history" ] || printf '# Reliability: earlier runs\n\nThe runs of `make chaos` that a later run replaced in docs/reliability.md, newest first.\n\n%s\n' "$history_mark" > "$history"
  # Below the mark, or at the end of a history without one.
  awk -v mark="$history_mark" -v replaced="$out/replaced.md" '
    function put() { print ""; while ((getline l < replaced) > 0) print l; done = 1 }
    { print }
    !done && $0 == mark { put() }
    END { if (!done) put() }' "$history" > "$out/history.md"
  # The history first: should the page's write fail, the replaced run is not lost.
  cp "$out/history.md" "$history"
fi
cp "$out/page.md" "$page"
done_stage
echo "chaos: figures in docs/reliability.md (the previous run in docs/reports/reliability-history.md) after $(( $(date +%s) - started ))s (suite exit status $status)" >&2
[ "$envtest_status" -eq 0 ] || exit $envtest_status
exit $status
