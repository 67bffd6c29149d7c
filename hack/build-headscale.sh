#!/usr/bin/env bash
# Builds Headscale (an independent Tailscale control server) from source into $1 (default
# bin/headscale), unless it is already there. The version is pinned by hack/headscale-tools/go.mod;
# `go install ...@version` is refused for it, so it is built inside that tools module instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bin/headscale}
if [ -x "$out" ]; then exit 0; fi
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
version=$(awk '{for (i = 1; i < NF; i++) if ($i == "github.com/juanfont/headscale") print $(i + 1)}' "$root/hack/headscale-tools/go.mod")
echo "building headscale $version into $out" >&2
cd "$root/hack/headscale-tools"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" github.com/juanfont/headscale/cmd/headscale
mv "$out.tmp" "$out"
