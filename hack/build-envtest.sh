#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd from source into $1 (default bin/envtest),
# skipping any binary already present. Prebuilt envtest archives cannot be downloaded on our
# machines; the Go module proxy can serve the sources.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/hack/go-build-progress.sh"
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
declare -A pkgs=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
)
missing=()
for name in etcd kube-apiserver kube-controller-manager; do
  [ -x "$out/$name" ] || missing+=("$name")
done
[ ${#missing[@]} -gt 0 ] || exit 0
wanted=()
for name in "${missing[@]}"; do wanted+=("${pkgs[$name]}"); done
echo "Building ${missing[*]} $k8s_version from source, once: 7-9 minutes on 2 cores with an empty Go build cache (downloads first, if any)." >&2
total=$(count_packages "${wanted[@]}")
for name in "${missing[@]}"; do
  go_build "$name" "$out/$name" "${pkgs[$name]}" "$total" -ldflags "$ldflags"
done
