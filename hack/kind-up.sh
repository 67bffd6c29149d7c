#!/usr/bin/env bash
# Creates (or reuses) the kind cluster the e2e suite runs on, with no container registry needed:
#   1. Docker Engine (hack/docker-up.sh: Debian's docker.io when missing, the VM fixes where needed);
#   2. kind, built from the module proxy at the version of hack/kind/versions.env;
#   3. the node image: $KIND_NODE_IMAGE when set (e.g. kind's published kindest/node on a laptop),
#      otherwise one built here from Debian packages and Go sources (hack/kind/build-node-image.sh),
#      cached as a tarball keyed by the pinned versions;
#   4. the cluster, one node, of IP family $KIND_IP_FAMILY (ipv4, the default, ipv6 or dual), and
#      its kubeconfig in bin/kubeconfig-$CLUSTER.
# Usage: kind-up.sh [CLUSTER]   (default tsingress-e2e)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib.sh"
source "$root/hack/kind/versions.env"
cluster=${1:-tsingress-e2e}
family=${KIND_IP_FAMILY:-ipv4}
case $family in
  ipv4|ipv6|dual) ;;
  *) die "KIND_IP_FAMILY=$family: want ipv4, ipv6 or dual" ;;
esac
started=$(date +%s)

"$root/hack/docker-up.sh"

kind=$root/bin/kind-$KIND_VERSION
if [ ! -x "$kind" ]; then
  stage "building kind $KIND_VERSION"
  mkdir -p "$root/bin"
  (cd "$root/hack/kind/node-tools" && CGO_ENABLED=0 go build -trimpath -o "$kind" sigs.k8s.io/kind)
  done_stage
fi
ln -sf "$(basename "$kind")" "$root/bin/kind"
k8s=$(k8s_version)
if [ ! -x "$root/bin/kubectl-$k8s" ]; then
  stage "building kubectl $k8s"
  build_kube kubectl "$root/bin/kubectl-$k8s"
  done_stage
fi
ln -sf "kubectl-$k8s" "$root/bin/kubectl"

image=${KIND_NODE_IMAGE:-}
if [ -z "$image" ]; then
  key=$(cache_key "$(cat "$root/hack/kind/versions.env")" "$k8s" "$(go env GOVERSION)" \
    "$(cat "$root/hack/kind/build-node-image.sh" "$root/hack/kind/10-ptp.conflist" "$root/hack/kind/default-cni.yaml")")
  image=tsingress/kind-node:$k8s-$key
  cached=$(cache_dir)/kind-node-$k8s-$key.tar.gz
  if docker image inspect "$image" >/dev/null 2>&1; then
    :
  elif [ -f "$cached" ]; then
    stage "loading the node image from $cached"
    gzip -dc "$cached" | docker load >/dev/null
    done_stage
  else
    stage "building node image $image (Kubernetes $k8s)"
    "$root/hack/kind/build-node-image.sh" "$image"
    done_stage
    stage "caching the node image in $cached"
    docker save "$image" | gzip -1 > "$cached.tmp" && mv "$cached.tmp" "$cached"
    echo "    $(du -h "$cached" | cut -f1)" >&2
    done_stage
  fi
fi

# wait_node_cidrs writes the cluster's kubeconfig and sets cidrs to its node's Pod CIDRs, waiting
# up to two minutes: a node container just started serves requests before its RBAC is loaded.
cidrs=
wait_node_cidrs() {
  local _
  for _ in $(seq 60); do
    if "$kind" get kubeconfig --name "$cluster" > "$root/bin/kubeconfig-$cluster" 2>/dev/null; then
      cidrs=$(KUBECONFIG=$root/bin/kubeconfig-$cluster "$root/bin/kubectl" get nodes -o jsonpath='{.items[*].spec.podCIDRs[*]}' 2>/dev/null || true)
      [ -n "$cidrs" ] && return 0
    fi
    sleep 2
  done
  return 1
}

config=$root/bin/kind-$cluster.yaml
# The node image routes Pods with ptp and host-local for IPv4 (hack/kind/10-ptp.conflist); a
# cluster of another family gets the node Pod CIDRs of its family instead, as kind allocates them
# (the first /24 of 10.244.0.0/16, the first /64 of fd00:10:244::/56), mounted over it.
cni=""
if [ "$family" != ipv4 ]; then
  cni=$root/bin/kind-$cluster-cni.conflist
  case $family in
    ipv6) ranges='[[{ "subnet": "fd00:10:244::/64" }]]' routes='[{ "dst": "::/0" }]' ;;
    dual) ranges='[[{ "subnet": "10.244.0.0/24" }], [{ "subnet": "fd00:10:244::/64" }]]' routes='[{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]' ;;
  esac
  sed -e "s|\"ranges\": .*|\"ranges\": $ranges,|" -e "s|\"routes\": .*|\"routes\": $routes|" "$root/hack/kind/10-ptp.conflist" > "$cni"
  grep -q 'fd00:10:244::/64' "$cni" || die "could not write the $family CNI config $cni"
fi
{
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  ipFamily: $family
nodes:
- role: control-plane
EOF
  if [ -n "$cni" ]; then
    cat <<EOF
  extraMounts:
  - hostPath: $cni
    containerPath: /etc/cni/net.d/10-ptp.conflist
    readOnly: true
EOF
  fi
  cat <<EOF
# L3 proxies turn on forwarding in their Pod's network namespace, by a privileged init container or,
# where a ProxyClass asks for it, by Pod sysctls, which the kubelet allows only when listed here.
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  allowedUnsafeSysctls: ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"]
EOF
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    # A cgroup v1 host: the kubelet refuses it unless told otherwise (it still runs there).
    echo "  failCgroupV1: false"
  fi
  if needs_runc_wrapper; then
    # Without CAP_SYS_RESOURCE the node's runc cannot raise a Pod's oom_score_adj.
    cat <<EOF
containerdConfigPatches:
- |
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
EOF
  fi
} > "$config"

node=$cluster-control-plane
# A node container stopped with dockerd (a reboot, a machine restored from a snapshot) is not
# restarted by Docker (kind sets restart on-failure): start it; one that does not come back in
# time is deleted, to be created afresh below.
if "$kind" get clusters 2>/dev/null | grep -qx "$cluster" &&
  [ "$(docker inspect -f '{{.State.Running}}' "$node" 2>/dev/null)" != true ]; then
  stage "starting the stopped node container $node"
  if docker start "$node" >/dev/null && wait_node_cidrs; then
    done_stage
  else
    echo "    the node did not come back: deleting cluster $cluster to create it again" >&2
    "$kind" delete cluster --name "$cluster"
  fi
fi
if "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
  running=$(docker inspect -f '{{.Config.Image}}' "$node" 2>/dev/null || true)
  if [ "$running" != "$image" ]; then
    echo "note: cluster $cluster runs node image $running, not $image; delete it (kind delete cluster --name $cluster) to use the new one" >&2
  fi
  # The family is fixed at creation: a cluster of another one is not reused.
  wait_node_cidrs || die "cluster $cluster lists no node with pod CIDRs"
  has=ipv4
  case $cidrs in
    *.*:*|*:*.*) has=dual ;;
    *:*) has=ipv6 ;;
  esac
  [ "$has" = "$family" ] || die "cluster $cluster is of IP family $has (Pod CIDRs $cidrs), not $family: delete it (make kind-delete) or name another (KIND_CLUSTER)"
else
  stage "creating cluster $cluster"
  "$kind" create cluster --name "$cluster" --image "$image" --config "$config" --wait 3m
  done_stage
fi
"$kind" get kubeconfig --name "$cluster" > "$root/bin/kubeconfig-$cluster"
echo "cluster $cluster is up (kubeconfig: bin/kubeconfig-$cluster) after $(( $(date +%s) - started ))s" >&2
