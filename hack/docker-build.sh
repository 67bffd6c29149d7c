#!/usr/bin/env bash
# Builds the operator and proxy images from Dockerfile.operator and Dockerfile.proxy, as users build
# them online, on a machine whose only registries are Debian's archive and the Go module proxy: base
# images come from hack/base-images.sh (the official ones pinned by digest, or local stand-ins,
# passed as the GO_IMAGE and BASE_IMAGE build arguments), and Go modules from this machine's module cache, served to
# the build as its GOPROXY. Usage: docker-build.sh OPERATOR_IMAGE PROXY_IMAGE VERSION
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib.sh"
operator_image=${1:?usage: docker-build.sh OPERATOR_IMAGE PROXY_IMAGE VERSION}
proxy_image=${2:?}
version=${3:-dev}
cd "$root"

"$root/hack/base-images.sh"
stage "filling the Go module cache for the build"
go mod download
done_stage

# The build's RUN steps reach the host at the default bridge's gateway.
gateway=$(ip -4 -o addr show docker0 | awk '{split($4, a, "/"); print a[1]; exit}')
[ -n "$gateway" ] || die "no IPv4 address on docker0, Docker's default bridge"
work=$(mktemp -d)
go build -o "$work/modcache-server" ./hack/modcache-server
"$work/modcache-server" -listen "$gateway:0" -port-file "$work/port" &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
goproxy=http://$gateway:$(cat "$work/port")

builder=$(docker_builder)
go_image=$(resolved_base golang)
for pair in "operator:$operator_image" "proxy:$proxy_image"; do
  component=${pair%%:*} image=${pair#*:}
  case $component in
  operator) base=$(resolved_base distroless-static) ;;
  proxy) base=$(resolved_base distroless-iptables) ;;
  esac
  stage "building $image from Dockerfile.$component on $base"
  DOCKER_BUILDKIT=1 "$builder" build --build-arg VERSION="$version" --build-arg GOPROXY="$goproxy" \
    --build-arg GO_IMAGE="$go_image" --build-arg BASE_IMAGE="$base" \
    -f "Dockerfile.$component" -t "$image" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; die "building $image failed"; }
  done_stage
  echo "    $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1/1e6}')" >&2
done
