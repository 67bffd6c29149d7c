#!/usr/bin/env bash
# Runs the Gateway API conformance suite (test/conformance) on a kind cluster with real Pods, the
# operator deployed and its tailnet up as hack/kind-deploy.sh does it, the Gateway API CRDs
# installed, and the suite's backends built here (its echo server from its own sources at the
# version go.mod pins, CoreDNS as the offline node image builds it) under local names.
# Environment: those of hack/kind-deploy.sh, and CONFORMANCE_PROFILES, CONFORMANCE_RUN_TEST,
# CONFORMANCE_REPORT (the report's path; none by default), CONFORMANCE_GO_TIMEOUT.
set -euo pipefail
started=$(date +%s)
source "$(dirname "$0")/kind-deploy.sh"

suite_version=$(go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api/conformance)
echo_image=tsingress.local/gateway-api-echo-basic:$suite_version
stage "building $echo_image from the conformance suite's sources"
work=$(mktemp -d)
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic
image_from_binary "$echo_image" distroless-static "$work/echo-basic"
rm -rf "$work"
done_stage

# Its UDP backend: CoreDNS with the whoami plugin, the offline node image's build (hack/kind/coredns)
# with that plugin added.
coredns_version=$(cd hack/kind/coredns && go list -m -f '{{.Version}}' github.com/coredns/coredns)
coredns_image=tsingress.local/coredns-conformance:$coredns_version
stage "building $coredns_image"
work=$(mktemp -d)
(cd hack/kind/coredns && CGO_ENABLED=0 go build -tags conformance -trimpath -ldflags "-s -w" -o "$work/coredns" .)
# Root, as the node image's: it binds port 53 with the capability the suite's Pod adds.
image_from_binary "$coredns_image" distroless-static "$work/coredns" 'USER 0:0'
rm -rf "$work"
"$kind" load docker-image --name "$cluster" "$echo_image" "$coredns_image" >/dev/null
done_stage

stage "installing the Gateway API CRDs (config/gateway-api)"
"$kubectl" apply --server-side --force-conflicts -k config/gateway-api >/dev/null
"$kubectl" wait --for condition=Established --timeout 60s -f config/gateway-api/gateway.networking.k8s.io_gatewayclasses.yaml >/dev/null
done_stage

# What an interrupted run left: its proxies' devices were on a tailnet that is gone.
stage "removing the namespaces of an earlier run"
"$kubectl" delete namespace --ignore-not-found --wait --timeout 180s \
  $("$kubectl" get namespaces -o name | sed -n 's|^namespace/\(gateway-conformance-.*\)|\1|p') >/dev/null 2>&1 || true
done_stage

stage "running the conformance suite (${CONFORMANCE_PROFILES:-GATEWAY-HTTP})"
report=${CONFORMANCE_REPORT:-}
[ -z "$report" ] || report=$(cd "$(dirname "$report")" && pwd)/$(basename "$report")
set +e
CONFORMANCE_IMAGES="registry.k8s.io/gateway-api/echo-basic=$echo_image,registry.k8s.io/coredns/coredns=$coredns_image" CONFORMANCE_REPORT=$report CONFORMANCE_VERSION=${VERSION:-dev} \
  go test -tags conformance ./test/conformance/ -run TestConformance -count 1 -timeout "${CONFORMANCE_GO_TIMEOUT:-50m}" -v
status=$?
set -e
done_stage
echo "conformance on kind: exit $status after $(( $(date +%s) - started ))s" >&2
exit $status
