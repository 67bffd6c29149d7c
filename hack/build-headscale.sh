#!/usr/bin/env bash
# Builds Headscale (an independent Tailscale control server) from source into $1 (default
# bin/headscale), unless it is already there. The version is pinned by hack/headscale-tools/go.mod;
# `go install ...@version` is refused for it, so it is built inside that tools module instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/hack/go-build-progress.sh"
out=${1:-$root/bin/headscale}
if [ -x "$out" ]; then exit 0; fi
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
version=$(awk '{for (i = 1; i < NF; i++) if ($i == "github.com/juanfont/headscale") print $(i + 1)}' "$root/hack/headscale-tools/go.mod")
cd "$root/hack/headscale-tools"
pkg=github.com/juanfont/headscale/cmd/headscale
echo "Building headscale $version from source, once: 5-8 minutes on 2 cores with an empty Go build cache (downloads first, if any)." >&2
go_build headscale "$out" "$pkg" "$(count_packages "$pkg")" -ldflags "-s -w"
