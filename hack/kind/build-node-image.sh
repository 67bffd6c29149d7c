#!/usr/bin/env bash
# Builds a kind node image for the Kubernetes release of hack/envtest-tools/go.mod with no container
# registry: a Debian rootfs from Debian's archive (debootstrap), kind's base files from the kind module,
# and every binary and image built from Go sources through the module proxy. Usage:
#   build-node-image.sh IMAGE
# Run as root (debootstrap, chroot). Binaries and rootfs are cached under $TSINGRESS_CACHE.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/hack/lib.sh"
source "$root/hack/kind/versions.env"
image=${1:?usage: build-node-image.sh IMAGE}
[ "$(id -u)" = 0 ] || die "building the node image needs root (debootstrap, chroot)"
k8s_version=$(k8s_version)

bin=$(cache_dir)/kind-bin-$(cache_key "$k8s_version" "$CONTAINERD_VERSION" "$CRICTL_VERSION" "$COREDNS_VERSION" "$(go env GOVERSION)")
mkdir -p "$bin"
work=$(mktemp -d /tmp/kind-node-build.XXXXXX)
cleanup() {
  if [ -n "${containerd_pid:-}" ]; then kill "$containerd_pid" 2>/dev/null || true; wait "$containerd_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# go_build NAME DIR PACKAGE [FLAGS...]: a static binary into the cache, unless it is there.
go_build() {
  local name=$1 dir=$2 pkg=$3
  shift 3
  [ -x "$bin/$name" ] && return
  local started=$(date +%s)
  echo "    building $name ($pkg)" >&2
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath "$@" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "    built $name in $(( $(date +%s) - started ))s" >&2
}

stage "building the node's binaries from source into $bin (cold: ~25 min on 2 cores; warm Go cache: a few minutes)"
# envtest's binaries are the same build (hack/build-envtest.sh): taken as they are when present.
for cmd in etcd kube-apiserver kube-controller-manager; do
  [ -x "$bin/$cmd" ] || [ ! -x "$root/bin/envtest/$cmd" ] || cp "$root/bin/envtest/$cmd" "$bin/$cmd"
done
go_build etcd "$root/hack/envtest-tools" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubeadm kubelet kubectl; do
  if [ ! -x "$bin/$cmd" ]; then
    t=$(date +%s)
    echo "    building $cmd" >&2
    build_kube "$cmd" "$bin/$cmd"
    echo "    built $cmd in $(( $(date +%s) - t ))s" >&2
  fi
done
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
for cmd in containerd ctr containerd-shim-runc-v2; do
  go_build "$cmd" "$root/hack/kind/containerd" "github.com/containerd/containerd/v2/cmd/$cmd" \
    -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "$ctrd_ldflags"
done
go_build crictl "$root/hack/kind/node-tools" sigs.k8s.io/cri-tools/cmd/crictl \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
go_build coredns "$root/hack/kind/coredns" . -ldflags "-s -w"
go_build pause "$root" ./hack/kind/pause -ldflags "-s -w"
done_stage

# The images kubeadm pulls, made from the binaries: static programs on a distroless-like base,
# kube-proxy on the iptables base that hack/base-images.sh also gives the proxy image.
stage "making the control-plane, etcd, CoreDNS and pause images"
"$root/hack/base-images.sh"
images=$work/images
mkdir -p "$images"
# image NAME BASE_IMAGE PATH_IN_IMAGE BINARY [docker import --change ...]: an image of BASE plus one
# binary, saved for the node's containerd.
image() {
  local name=$1 base=$2 path=$3 binary=$4
  shift 4
  docker rm -f tsingress-image-build >/dev/null 2>&1 || true
  docker create --name tsingress-image-build "$base" /nothing >/dev/null
  docker cp "$binary" "tsingress-image-build:$path"
  docker commit "$@" tsingress-image-build "$name" >/dev/null
  docker rm -f tsingress-image-build >/dev/null
  docker save "$name" > "$images/$(echo "$name" | tr '/:' '__').tar"
  # Kubeadm asks for these names inside the node; the machine keeps no image under them.
  docker rmi "$name" >/dev/null
}
static_base=$(resolved_base distroless-static)
iptables_base=$(resolved_base distroless-iptables)
path_env='ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin'
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
  image "registry.k8s.io/$cmd:$k8s_version" "$static_base" /usr/local/bin/ "$bin/$cmd" \
    --change "$path_env" --change "ENTRYPOINT [\"/usr/local/bin/$cmd\"]" --change 'USER 0:0'
done
image "registry.k8s.io/kube-proxy:$k8s_version" "$iptables_base" /usr/local/bin/ "$bin/kube-proxy" \
  --change "$path_env" --change 'ENTRYPOINT ["/usr/local/bin/kube-proxy"]' --change 'USER 0:0'
image "registry.k8s.io/etcd:$ETCD_IMAGE_TAG" "$static_base" /usr/local/bin/ "$bin/etcd" \
  --change "$path_env" --change 'ENTRYPOINT ["/usr/local/bin/etcd"]' --change 'USER 0:0'
image "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" "$static_base" /coredns "$bin/coredns" \
  --change 'ENTRYPOINT ["/coredns"]' --change 'EXPOSE 53 53/udp' --change 'USER 0:0'
# Two pause tags: containerd's sandbox image (kind's containerd config) and kubeadm's.
pause_tags=(3.10 $("$bin/kubeadm" config images list --kubernetes-version "$k8s_version" 2>/dev/null | sed -n 's#^registry.k8s.io/pause:##p'))
for tag in $(printf '%s\n' "${pause_tags[@]}" | sort -u); do
  image "registry.k8s.io/pause:$tag" "$static_base" /pause "$bin/pause" \
    --change 'ENTRYPOINT ["/pause"]' --change 'USER 65535:65535'
done
# Every image kubeadm asks for must be here, or the cluster would try to pull it.
for want in $("$bin/kubeadm" config images list --kubernetes-version "$k8s_version"); do
  [ -f "$images/$(echo "$want" | tr '/:' '__').tar" ] || die "kubeadm wants $want, which this script does not build: update versions.env"
done
done_stage

stage "making the node's root filesystem (Debian $DEBIAN_SUITE, cached)"
rootfs=$work/rootfs
mkdir -p "$rootfs"
tar -C "$rootfs" -xf "$(debian_rootfs node systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,fuse-overlayfs,socat,ebtables,ipset,ca-certificates,curl,jq,procps,runc,containernetworking-plugins,bash)"
kind_src=$(cd "$root/hack/kind/node-tools" && go list -m -f '{{.Dir}}' sigs.k8s.io/kind 2>/dev/null || true)
if [ -z "$kind_src" ] || [ ! -d "$kind_src/images/base/files" ]; then
  kind_src=$(cd "$root/hack/kind/node-tools" && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
fi
files=$kind_src/images/base/files
# What kind's base image Dockerfile does, on a rootfs instead of in docker build.
install -m 0755 "$files"/usr/local/bin/* "$rootfs/usr/local/bin/"
mkdir -p "$rootfs/kind/bin" "$rootfs/etc/containerd" "$rootfs/etc/default" "$rootfs/etc/sysctl.d" \
  "$rootfs/etc/systemd/system/kubelet.service.d" "$rootfs/etc/kubernetes/manifests"
install -m 0644 "$files"/kind/README.txt "$rootfs/kind/"
install -m 0755 "$files"/kind/bin/* "$rootfs/kind/bin/"
install -m 0644 "$files"/etc/crictl.yaml "$rootfs/etc/"
install -m 0644 "$files"/etc/containerd/* "$rootfs/etc/containerd/"
install -m 0644 "$files"/etc/default/* "$rootfs/etc/default/"
install -m 0644 "$files"/etc/sysctl.d/* "$rootfs/etc/sysctl.d/"
install -m 0644 "$files"/etc/systemd/system/*.service "$files"/etc/systemd/system/*.slice "$rootfs/etc/systemd/system/"
install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$rootfs/etc/systemd/system/kubelet.service.d/"
find "$rootfs/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$rootfs"/lib/systemd/system/multi-user.target.wants/* "$rootfs"/etc/systemd/system/*.wants/* \
  "$rootfs"/lib/systemd/system/local-fs.target.wants/* "$rootfs"/lib/systemd/system/sockets.target.wants/*udev* \
  "$rootfs"/lib/systemd/system/sockets.target.wants/*initctl* "$rootfs"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> "$rootfs/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$rootfs/sbin/init"
systemctl --root="$rootfs" enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
systemctl --root="$rootfs" mask systemd-binfmt.service >/dev/null 2>&1
install -m 0755 "$bin"/containerd "$bin"/ctr "$bin"/containerd-shim-runc-v2 "$bin"/crictl "$rootfs/usr/local/bin/"
install -m 0755 "$bin"/kubeadm "$bin"/kubelet "$bin"/kubectl "$rootfs/usr/bin/"
# Debian's CNI plugins live in /usr/lib/cni; containerd looks in /opt/cni/bin.
mkdir -p "$rootfs/opt/cni/bin" "$rootfs/etc/cni/net.d" "$rootfs/kind/manifests"
for p in "$rootfs"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/$(basename "$p")" "$rootfs/opt/cni/bin/"; done
"$bin/ctr" oci spec | chroot "$rootfs" jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | chroot "$rootfs" jq 'del(.process.rlimits)' > "$rootfs/etc/containerd/cri-base.json"
echo "$k8s_version" > "$rootfs/kind/version"
# kindnetd cannot be built here (its module version is not served), so the node routes Pods itself:
# ptp veths with host-local addresses from the node's Pod CIDR, as kindnetd does on one node.
install -m 0644 "$root/hack/kind/10-ptp.conflist" "$rootfs/etc/cni/net.d/"
install -m 0644 "$root/hack/kind/default-cni.yaml" "$rootfs/kind/manifests/"
done_stage

stage "preloading the images into the node's containerd"
# The node's own containerd, run here against the rootfs: the images' contents and metadata land in
# its /var/lib/containerd, not unpacked (the node unpacks them on first use, as kind's images do).
cat > "$work/containerd.toml" <<EOF
version = 3
root = "$rootfs/var/lib/containerd"
state = "$work/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime"]
[grpc]
  address = "$work/containerd.sock"
EOF
"$bin/containerd" --config "$work/containerd.toml" >"$work/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 50); do [ -S "$work/containerd.sock" ] && break; sleep 0.2; done
for tar in "$images"/*.tar; do
  "$bin/ctr" --address "$work/containerd.sock" --namespace k8s.io images import \
    --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - < "$tar" >/dev/null \
    || { tail -20 "$work/containerd.log"; die "importing $tar failed"; }
done
"$bin/ctr" --address "$work/containerd.sock" --namespace k8s.io images list -q | grep -v '^sha256:' | sed 's/^/    /' >&2
kill "$containerd_pid"; wait "$containerd_pid" 2>/dev/null || true
containerd_pid=
done_stage

stage "importing the node image $image"
tar -C "$rootfs" --numeric-owner --xattrs -c . | docker import \
  --change 'ENV container=docker' \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$image.tmp" >/dev/null
# docker import (Docker 20.10) refuses STOPSIGNAL; a build from the imported image adds it.
printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$image.tmp" | DOCKER_BUILDKIT=0 docker build -q -t "$image" - >/dev/null
docker rmi "$image.tmp" >/dev/null
done_stage
