#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd from source into $1 (default bin/envtest),
# skipping any binary already present. Prebuilt envtest archives cannot be downloaded on our
# machines; the Go module proxy can serve the sources.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bin/envtest}
mkdir -p "$out"
out=$(cd "$out" && pwd)
k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2}' "$root/hack/envtest-tools/go.mod")
minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
done
cd "$root/hack/envtest-tools"
build() { # name package
  if [ -x "$out/$1" ]; then return; fi
  echo "building $1 ($2) into $out" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$1.tmp" "$2"
  mv "$out/$1.tmp" "$out/$1"
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
