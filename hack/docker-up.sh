#!/usr/bin/env bash
# Makes a Docker Engine available: uses a running one, or installs Debian's docker.io when missing and
# starts dockerd (machines without systemd). On machines whose bounding set lacks a capability Docker
# grants to privileged containers (kind's nodes are privileged), installs hack/runc-wrapper as the
# default runtime; elsewhere Docker is left as it is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib.sh"

if docker info >/dev/null 2>&1 && ! needs_runc_wrapper; then
  exit 0
fi

if ! command -v dockerd >/dev/null; then
  stage "installing Docker Engine from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io containerd runc iptables >/dev/null
  done_stage
fi

daemon_json=/etc/docker/daemon.json
if needs_runc_wrapper; then
  wrapper=/usr/local/libexec/tsingress/runc-wrapper
  if [ ! -x "$wrapper" ] || [ "$root/hack/runc-wrapper/main.go" -nt "$wrapper" ]; then
    stage "building the runc wrapper (this machine lacks $(missing_caps) in its bounding set)"
    mkdir -p "$(dirname "$wrapper")"
    (cd "$root" && CGO_ENABLED=0 go build -o "$wrapper.tmp" ./hack/runc-wrapper && mv "$wrapper.tmp" "$wrapper")
    done_stage
  fi
  mkdir -p /etc/docker
  want="{\"default-runtime\": \"capfix\", \"runtimes\": {\"capfix\": {\"path\": \"$wrapper\"}}}"
  if [ "$(cat "$daemon_json" 2>/dev/null)" != "$want" ]; then
    [ -f "$daemon_json" ] && cp "$daemon_json" "$daemon_json.before-tsingress"
    echo "$want" > "$daemon_json"
    # A running dockerd reloads its runtimes on SIGHUP.
    pkill -HUP -x dockerd 2>/dev/null || true
  fi
fi

if ! docker info >/dev/null 2>&1; then
  stage "starting dockerd (log: /var/log/dockerd.log)"
  if ! pgrep -x dockerd >/dev/null; then
    # containerd from Debian's package is started by dockerd itself.
    setsid nohup dockerd >>/var/log/dockerd.log 2>&1 </dev/null &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/dockerd.log; die "dockerd did not start"; }
  done_stage
fi
