# Shared by the hack/ scripts: progress lines with durations, and facts about this machine.

_stage_start=0
_stage_name=""
# stage prints what starts now; done_stage prints how long it took.
stage() { _stage_name=$1; _stage_start=$(date +%s); echo "==> $1" >&2; }
done_stage() { echo "    done in $(( $(date +%s) - _stage_start ))s: $_stage_name" >&2; }
die() { echo "error: $*" >&2; exit 1; }

# missing_caps names the capabilities Docker grants privileged containers that this machine's bounding
# set lacks (CAP_SYS_RESOURCE on some VMs).
missing_caps() {
  local bnd
  bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  # Bit 24 is CAP_SYS_RESOURCE, the one seen missing; check the others privileged containers need.
  local missing=()
  (( (0x$bnd >> 24) & 1 )) || missing+=(CAP_SYS_RESOURCE)
  (( (0x$bnd >> 21) & 1 )) || missing+=(CAP_SYS_ADMIN)
  echo "${missing[*]}"
}
needs_runc_wrapper() { [ -n "$(missing_caps)" ]; }

# cache_dir is where expensive builds are kept between runs (binaries, root filesystems, node images).
cache_dir() {
  local d=${TSINGRESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tsingress}
  mkdir -p "$d"
  echo "$d"
}
# cache_key ARGS...: a short hash of what a cached build depends on.
cache_key() { printf '%s\n' "$@" | sha256sum | cut -c1-12; }
# k8s_version is the Kubernetes release pinned by hack/envtest-tools/go.mod.
k8s_version() { awk '$1=="k8s.io/kubernetes"{print $2}' "$(dirname "${BASH_SOURCE[0]}")/envtest-tools/go.mod"; }

# debian_rootfs NAME PACKAGES: a tarball of a minimal Debian root filesystem with the comma-separated
# packages, built with debootstrap from Debian's archive on first use and cached.
debian_rootfs() {
  local name=$1 packages=$2
  source "$(dirname "${BASH_SOURCE[0]}")/kind/versions.env"
  local tarball
  tarball=$(cache_dir)/rootfs-$name-$(cache_key "$DEBIAN_SUITE" "$DEBIAN_MIRROR" "$packages").tar
  if [ ! -f "$tarball" ]; then
    command -v debootstrap >/dev/null || {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
    local dir
    dir=$(mktemp -d /tmp/rootfs-$name.XXXXXX)
    echo "    debootstrap $DEBIAN_SUITE ($name: $packages), about a minute" >&2
    debootstrap --variant=minbase --include="$packages" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" >"$dir.log" 2>&1 \
      || { tail -20 "$dir.log" >&2; rm -rf "$dir"; return 1; }
    # What a container image leaves out: caches, documentation, the archive's lists.
    rm -rf "$dir"/var/cache/apt/* "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/* \
      "$dir"/usr/share/info/* "$dir"/var/log/*.log "$dir.log"
    find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
    tar -C "$dir" --numeric-owner --xattrs -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
  fi
  echo "$tarball"
}

# base_image ROLE: the official image, pinned by digest, that the Dockerfiles name for ROLE (their
# GO_IMAGE and BASE_IMAGE build arguments default to these).
base_image() {
  case $1 in
  golang) echo "golang:1.26-bookworm@sha256:b305420a68d0f229d91eb3b3ed9e519fcf2cf5461da4bef997bf927e8c0bfd2b" ;;
  distroless-static) echo "gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab" ;;
  distroless-iptables) echo "registry.k8s.io/build-image/distroless-iptables:v0.8.6@sha256:4e0a77d0973618ce2a76e65fa2dc97694eb690ac8baf69cefe6e20f17957d9dd" ;;
  *) die "unknown base image role $1" ;;
  esac
}

# standin_image ROLE: the local name of the stand-in hack/base-images.sh makes for ROLE where no
# registry answers: under tsingress.local/, never an official image's name.
standin_image() {
  case $1 in
  golang | distroless-static | distroless-iptables) echo "tsingress.local/standin/$1:1" ;;
  *) die "unknown base image role $1" ;;
  esac
}

# resolved_base ROLE: the image to build on for ROLE: the official one where it is here (pulled),
# else the stand-in.
resolved_base() {
  local official
  official=$(base_image "$1")
  if docker image inspect "$official" >/dev/null 2>&1; then echo "$official"; else standin_image "$1"; fi
}

# image_from_binary IMAGE ROLE BINARY [CHANGE...] commits IMAGE: the base image of ROLE
# (resolved_base) with BINARY at /<its name> as its entrypoint, and each CHANGE (a Dockerfile
# instruction, as docker commit --change takes it). Test tooling only: nothing built so ships.
image_from_binary() {
  local image=$1 role=$2 binary=$3 name container
  shift 3
  name=$(basename "$binary")
  container=tsingress-$name-build
  local changes=(--change "ENTRYPOINT [\"/$name\"]")
  for c in "$@"; do changes+=(--change "$c"); done
  docker rm -f "$container" >/dev/null 2>&1 || true
  docker create --name "$container" "$(resolved_base "$role")" /nothing >/dev/null
  docker cp "$binary" "$container:/$name"
  docker commit "${changes[@]}" "$container" "$image" >/dev/null
  docker rm -f "$container" >/dev/null
}

# docker_builder prints a Docker client that builds with BuildKit: docker with its buildx plugin, or
# Debian's docker.io client (BuildKit built in) where the docker on PATH lacks buildx.
docker_builder() {
  if docker buildx version >/dev/null 2>&1; then echo docker
  elif [ -x /usr/bin/docker ]; then echo /usr/bin/docker
  else echo docker
  fi
}

# build_kube CMD OUT builds a Kubernetes command (k8s.io/kubernetes/cmd/CMD) at the pinned release,
# with the version stamped as a release build stamps it.
build_kube() {
  local cmd=$1 out=$2 version minor ldflags="-s -w"
  version=$(k8s_version)
  minor=$(echo "$version" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  (cd "$(dirname "${BASH_SOURCE[0]}")/envtest-tools" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$out.tmp" "$out"
}
