#!/usr/bin/env bash
# Makes sure the base images of Dockerfile.operator and Dockerfile.proxy (and of the offline kind
# node's images) are here: the official images, pinned by digest (hack/lib.sh base_image), pulled
# where a registry answers; otherwise local stand-ins made from Debian's archive (debootstrap) and
# the local Go toolchain, under local names (tsingress.local/standin/..., never an official name):
#   golang               Debian + this machine's Go
#   distroless-static    CA certificates, passwd with nonroot (65532), /tmp
#   distroless-iptables  Debian with iptables (legacy and nft), nftables, conntrack
# hack/docker-build.sh passes whichever is here to the Dockerfiles as build arguments.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib.sh"

present() { docker image inspect "$1" >/dev/null 2>&1; }
pulled() { timeout 120 docker pull -q "$1" >/dev/null 2>&1; }

# Stand-ins that earlier versions of this script made under the official tags: an imported image
# has no registry digest. Untagged, so that nothing mistakes them for the real images.
for old in golang:1.26-bookworm gcr.io/distroless/static-debian12:nonroot registry.k8s.io/build-image/distroless-iptables:v0.8.6; do
  if present "$old" && [ "$(docker image inspect -f '{{len .RepoDigests}}' "$old")" = 0 ]; then
    docker rmi "$old" >/dev/null
  fi
done

missing=()
for role in distroless-iptables distroless-static golang; do
  img=$(base_image "$role")
  present "$img" || present "$(standin_image "$role")" || pulled "$img" || missing+=("$role")
done
[ ${#missing[@]} -eq 0 ] && exit 0

stage "making local stand-ins for ${missing[*]}"
debian=$(debian_rootfs images ca-certificates,iptables,nftables,conntrack)
work=$(mktemp -d /tmp/base-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debian"
tar -C "$work/debian" -xf "$debian"
printf 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >> "$work/debian/etc/passwd"
printf 'nonroot:x:65532:\n' >> "$work/debian/etc/group"
mkdir -p "$work/debian/home/nonroot" && chown 65532:65532 "$work/debian/home/nonroot"

for role in "${missing[@]}"; do
  img=$(standin_image "$role")
  case $role in
  distroless-iptables)
    tar -C "$work/debian" --numeric-owner -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$img" >/dev/null ;;
  distroless-static)
    # Only what distroless/static holds: users, CA certificates, /tmp; no shell, no libc.
    s=$work/static
    mkdir -p "$s/etc/ssl/certs" "$s/tmp" "$s/home/nonroot" "$s/usr/local/bin" "$s/root"
    chmod 1777 "$s/tmp"
    chown 65532:65532 "$s/home/nonroot"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$s/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$s/etc/group"
    cp "$work/debian/etc/ssl/certs/ca-certificates.crt" "$s/etc/ssl/certs/"
    cp "$work/debian/etc/nsswitch.conf" "$s/etc/"
    tar -C "$s" --numeric-owner -c . | docker import \
      --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$img" >/dev/null ;;
  golang)
    goroot=$(go env GOROOT)
    mkdir -p "$work/debian/usr/local" "$work/debian/go"
    cp -a "$goroot" "$work/debian/usr/local/go"
    rm -rf "$work/debian/usr/local/go/pkg/obj" "$work/debian/usr/local/go/test"
    tar -C "$work/debian" --numeric-owner -c . | docker import \
      --change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'WORKDIR /go' - "$img" >/dev/null ;;
  esac
  echo "    $img: $(docker image inspect -f '{{.Size}}' "$img" | awk '{printf "%d MB", $1/1e6}')" >&2
done
done_stage
