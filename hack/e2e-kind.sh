#!/usr/bin/env bash
# Runs the e2e suite on a kind cluster with real Pods, the operator deployed and its tailnet up as
# hack/kind-deploy.sh does it.
# Environment: KIND_CLUSTER, KIND_IP_FAMILY, IMG_OPERATOR, IMG_PROXY, VERSION, KUSTOMIZE, INSTALL, HELM, E2E_ARGS, E2E_GO_TIMEOUT.
set -euo pipefail
started=$(date +%s)
source "$(dirname "$0")/kind-deploy.sh"

export E2E_IP_FAMILY=${KIND_IP_FAMILY:-ipv4}
stage "running the e2e suite ($E2E_IP_FAMILY)"
set +e
go test -tags e2e ./test/e2e/ -timeout "${E2E_GO_TIMEOUT:-40m}" -v ${E2E_ARGS:--ginkgo.v}
status=$?
set -e
done_stage
echo "e2e on kind: exit $status after $(( $(date +%s) - started ))s" >&2
exit $status
