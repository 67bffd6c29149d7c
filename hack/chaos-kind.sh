#!/usr/bin/env bash
# Runs the reliability suites and writes their figures into docs/reliability.md:
#   1. test/reliability against envtest (bad input, documents edited by hand, least privilege,
#      credentials in the operator's log and Events);
#   2. test/chaos on kind cluster KIND_CLUSTER (tsingress-chaos by default), the operator deployed
#      and the local tailnet up as hack/kind-deploy.sh does it: the operator killed while objects
#      churn, proxy Pods deleted, replicas deleted and evicted under load, the API server and the
#      tailnet's control server down, documents corrupted under load, and the credential search
#      over every log and Event.
# The fuzzing figures come from the last `make fuzz` (bin/fuzz-summary.txt), when there is one.
# Environment: KIND_CLUSTER, IMG_OPERATOR, IMG_PROXY, VERSION, KUSTOMIZE, ENVTEST_ASSETS, CHAOS_ARGS,
# CHAOS_POD_DELETIONS, CHAOS_OPERATOR_KILLS, CHAOS_OBJECTS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export KIND_CLUSTER=${KIND_CLUSTER:-tsingress-chaos}
started=$(date +%s)
out=$root/bin/reliability
rm -rf "$out"
mkdir -p "$out/logs"

source "$root/hack/lib.sh"
stage "test/reliability against envtest"
set +e
KUBEBUILDER_ASSETS=${ENVTEST_ASSETS:-$root/bin/envtest} KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=120s \
  RELIABILITY_REPORT=$out/envtest.md go test ./test/reliability/ -count=1 -timeout 15m
envtest_status=$?
set -e
done_stage
[ -f "$out/envtest.md" ] || echo "test/reliability wrote no figures (exit status $envtest_status)." > "$out/envtest.md"

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

stage "writing docs/reliability.md"
# What follows the marker is written by hand (what the runs found and what was done) and kept.
marker='<!-- Written by hand below; make chaos keeps it. -->'
findings=$(sed -n "/^$marker\$/,\$p" "$root/docs/reliability.md" 2>/dev/null || true)
{
  cat <<MD
# Reliability

What the operator and its proxies survive, counted by the suites that do it to them: written by
\`make chaos\` (hack/chaos-kind.sh) from a run at $(git -C "$root" rev-parse --short HEAD) on $(date -u +%Y-%m-%d), on a machine with
$(nproc) cores. Every figure below is counted by a test, and every loop of theirs is bounded in time and count.

- \`test/reliability\` (envtest: a real API server, etcd and controller manager, the operator in-process, the local
  tailnet): bad input, documents edited by hand, least privilege, credentials in the operator's log. It runs in
  \`make test\`, hence in CI.
- \`test/chaos\` (build tag \`chaos\`, a kind cluster with the images built from the Dockerfiles, the local tailnet
  and its CA): the faults below, and the search for credentials in every log and Event of the run.
- Fuzzing (\`make fuzz\`, \`hack/fuzz.sh\`): the seed corpora and saved inputs run in \`make test\`.

## On a kind cluster (test/chaos)

Run: \`make chaos\` with $counts (the issue's counts are the defaults), kind node $(docker exec "$KIND_CLUSTER-control-plane" kubelet --version 2>/dev/null | awk '{print $2}'),
started $(date -u -d @"$started" '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - started ))s in all. Outcome: $(if [ "$status" -eq 0 ]; then echo "every spec passed."; else echo "exit status $status; the failed specs, whose figures below miss their goals:"; fi)
MD
  if [ -n "$failed_specs" ]; then
    echo
    printf '%s\n' "$failed_specs" | sed 's/^/- /'
  fi
  echo
  cat "$out/chaos.md"
  printf '\n## Against envtest (test/reliability)\n\n'
  if [ "$envtest_status" -eq 0 ]; then echo 'Outcome: every spec passed.'; else echo "Outcome: exit status $envtest_status (see the run's output)."; fi
  echo
  cat "$out/envtest.md"
  printf '\n## Fuzzing\n\n'
  if [ -f "$root/bin/fuzz-summary.txt" ]; then
    echo "From \`make fuzz\` on $(date -u -r "$root/bin/fuzz-summary.txt" +%Y-%m-%d): each target, its executions and the inputs that found new code:"
    echo
    echo '```'
    cat "$root/bin/fuzz-summary.txt"
    echo '```'
  else
    echo 'No `make fuzz` run on this machine yet: see the last committed figures in git history.'
  fi
  if [ -n "$findings" ]; then
    printf '\n%s\n' "$findings"
  fi
} > "$root/docs/reliability.md"
done_stage
echo "chaos: figures in docs/reliability.md after $(( $(date +%s) - started ))s (suite exit status $status)" >&2
[ "$envtest_status" -eq 0 ] || exit $envtest_status
exit $status
