# Sourced by the scripts that run a suite on a kind cluster with real Pods (hack/e2e-kind.sh,
# hack/chaos-kind.sh): the cluster (hack/kind-up.sh), the images from the Dockerfiles
# (hack/docker-build.sh) loaded into it, and a tailnet for it to join. With TS_API_CLIENT_ID and
# TS_API_CLIENT_SECRET set, that is your real tailnet; otherwise it is the local tailnet (control
# server, DERP, the API subset and an ACME CA) run here until the sourcing script exits,
# listening on the kind network's gateway where the Pods reach it. The operator is installed
# with `make deploy` and an overlay generated into bin/kind-overlay-$cluster that points it there,
# or with INSTALL=helm by `helm upgrade --install` of charts/tailscale-operator with the same
# settings, in a values file generated into the same directory.
# It leaves in the environment what the suites read: KUBECONFIG, TS_*, E2E_CA_FILE,
# E2E_BACKEND_IMAGE, E2E_PROXYPROTOCOL_IMAGE, E2E_PRIVILEGED_NAMESPACE (kustomize installs) and, with the local tailnet,
# E2E_FUNNEL_ADDR, LOCALTAILNET_ADMIN_URL and LOCALTAILNET_LOG.
# Environment: KIND_CLUSTER, IMG_OPERATOR, IMG_PROXY, VERSION, KUSTOMIZE, KIND_OPERATOR_SETTINGS,
# INSTALL (kustomize, the default, or helm), HELM.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/hack/lib.sh"
cd "$root"
cluster=${KIND_CLUSTER:-tsingress-e2e}
img_operator=${IMG_OPERATOR:-ghcr.io/tsingress/operator:dev}
img_proxy=${IMG_PROXY:-ghcr.io/tsingress/proxy:dev}
install=${INSTALL:-kustomize}
case $install in
  kustomize) ;;
  helm) helm=${HELM:?INSTALL=helm needs HELM, the helm binary (make helm builds it)} ;;
  *) die "INSTALL=$install: want kustomize or helm" ;;
esac

"$root/hack/kind-up.sh" "$cluster"
export KUBECONFIG=$root/bin/kubeconfig-$cluster
kubectl=$root/bin/kubectl
kind=$root/bin/kind

"$root/hack/docker-build.sh" "$img_operator" "$img_proxy" "${VERSION:-dev}"

# The backend the specs run: agnhost, from the registry where it answers, else built here from the
# Kubernetes sources this cluster runs, under a local name (an official name is never given to an
# image built here; one an earlier version of this script made is untagged).
backend_image=${E2E_BACKEND_IMAGE:-registry.k8s.io/e2e-test-images/agnhost:2.53}
tools=$root/hack/envtest-tools
agnhost_version=$(cat "$(cd "$tools" && go list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost)/VERSION")
for old in "$backend_image" "registry.k8s.io/e2e-test-images/agnhost:$agnhost_version"; do
  if docker image inspect "$old" >/dev/null 2>&1 && [ "$(docker image inspect -f '{{len .RepoDigests}}' "$old")" = 0 ]; then
    docker rmi "$old" >/dev/null
  fi
done
local_backend=tsingress.local/agnhost:$agnhost_version
if docker image inspect "$backend_image" >/dev/null 2>&1; then
  :
elif docker image inspect "$local_backend" >/dev/null 2>&1; then
  backend_image=$local_backend
elif ! timeout 120 docker pull -q "$backend_image" >/dev/null 2>&1; then
  backend_image=$local_backend
  stage "building $backend_image from source"
  work=$(mktemp -d)
  (cd "$tools" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/agnhost" k8s.io/kubernetes/test/images/agnhost)
  image_from_binary "$backend_image" distroless-iptables "$work/agnhost"
  rm -rf "$work"
  done_stage
fi
export E2E_BACKEND_IMAGE=$backend_image

# The PROXY protocol specs' backend: test tooling built here from test/backends, never shipped.
proxyprotocol_image=tsingress.local/proxyprotocol-echo:dev
stage "building $proxyprotocol_image"
work=$(mktemp -d)
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/proxyprotocol-echo" ./test/backends/proxyprotocol-echo)
image_from_binary "$proxyprotocol_image" distroless-static "$work/proxyprotocol-echo"
rm -rf "$work"
done_stage
export E2E_PROXYPROTOCOL_IMAGE=$proxyprotocol_image

stage "loading the images into kind"
"$kind" load docker-image --name "$cluster" "$img_operator" "$img_proxy" "$backend_image" "$proxyprotocol_image" >/dev/null
done_stage

overlay=$root/bin/kind-overlay-$cluster
rm -rf "$overlay"
mkdir -p "$overlay"
if [ -n "${TS_API_CLIENT_ID:-}" ] && [ -n "${TS_API_CLIENT_SECRET:-}" ]; then
  printf '%s' "$TS_API_CLIENT_ID" > "$overlay/client_id"
  printf '%s' "$TS_API_CLIENT_SECRET" > "$overlay/client_secret"
  settings=()
  proxy_ca=""
else
  stage "starting the local tailnet on the kind network"
  # The kind network's gateway: this machine, as the Pods see it; its IPv6 one for Pods of an
  # IPv6-only cluster, which have no IPv4 route.
  if [ "${KIND_IP_FAMILY:-ipv4}" = ipv6 ]; then
    gateway=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' | tr ' ' '\n' | grep -m1 ':') \
      || die "the kind network has no IPv6 gateway"
  else
    gateway=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' | tr ' ' '\n' | grep -m1 '\.') \
      || die "the kind network has no IPv4 gateway"
  fi
  go build -o "$root/bin/localtailnet" ./tools/localtailnet
  tailnet_dir=$(mktemp -d /tmp/kind-tailnet.XXXXXX)
  # The admin endpoint (loopback) lets a suite take the control server down and count the CA's orders.
  "$root/bin/localtailnet" -addr "[$gateway]:0" -dir "$tailnet_dir" -env-file "$tailnet_dir/env" -admin-addr 127.0.0.1:0 \
    -funnel -funnel-tags tag:k8s >"$tailnet_dir/log" 2>&1 &
  tailnet_pid=$!
  trap 'kill $tailnet_pid 2>/dev/null; wait $tailnet_pid 2>/dev/null; rm -rf "$tailnet_dir"' EXIT
  for _ in $(seq 300); do [ -f "$tailnet_dir/env" ] && break; kill -0 $tailnet_pid 2>/dev/null || break; sleep 0.1; done
  [ -f "$tailnet_dir/env" ] || { cat "$tailnet_dir/log"; die "the local tailnet did not start"; }
  set -a
  source "$tailnet_dir/env"
  set +a
  export LOCALTAILNET_LOG=$tailnet_dir/log
  printf '%s' "$TS_API_CLIENT_ID" > "$overlay/client_id"
  printf '%s' "$TS_API_CLIENT_SECRET" > "$overlay/client_secret"
  cp "$ACME_API_ROOT_FILE" "$overlay/local-acme-api-root.pem"
  # The proxies get their certificates from the local CA (its directory is HTTPS with a root of
  # its own, which they trust through the CA ConfigMap), and the suite's client trusts what it issues.
  # It has none of Let's Encrypt's weekly limits, which a reused cluster's ledger would reach.
  settings=(
    "OPERATOR_LOGIN_SERVER=$TS_CONTROL_URL"
    "TS_API_BASE_URL=$TS_API_BASE_URL"
    "ACME_DIRECTORY_URL=$TS_DEBUG_ACME_DIRECTORY_URL"
    ACME_NEW_CERTIFICATES_PER_WEEK=100000
    ACME_CERTIFICATES_PER_NAME_PER_WEEK=100000
    PROXY_CA_CONFIGMAP=proxy-ca
  )
  proxy_ca=local-acme-api-root.pem
  export E2E_CA_FILE=$ACME_ROOTS_FILE
  # The suite's client on the internet reaches the names served over Funnel here.
  export E2E_FUNNEL_ADDR=$FUNNEL_ADDR
  unset TS_DEBUG_ACME_DIRECTORY_URL
  done_stage
fi
# Settings of the calling suite (KEY=VALUE, space-separated), after the tailnet's.
for kv in ${KIND_OPERATOR_SETTINGS:-}; do
  settings+=("$kv")
done
chmod 600 "$overlay/client_id" "$overlay/client_secret"

if [ "$install" = helm ]; then
  # yaml_string S: S as a double-quoted YAML string.
  yaml_string() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
  # image_values REF: the chart's repository, tag and digest for REF, as render.sh splits it.
  image_values() {
    local ref=$1
    if [[ $ref == *@* ]]; then
      printf '    repository: %s\n    digest: %s\n' "$(yaml_string "${ref%@*}")" "$(yaml_string "${ref#*@}")"
    elif [[ ${ref##*/} == *:* ]]; then
      printf '    repository: %s\n    tag: %s\n' "$(yaml_string "${ref%:*}")" "$(yaml_string "${ref##*:}")"
    else
      printf '    repository: %s\n' "$(yaml_string "$ref")"
    fi
  }
  {
    echo "# Generated by hack/kind-deploy.sh: the chart's values for the run's tailnet, as the kustomize overlay beside it sets them."
    echo "oauth:"
    echo "  clientId: $(yaml_string "$(cat "$overlay/client_id")")"
    echo "  clientSecret: $(yaml_string "$(cat "$overlay/client_secret")")"
    echo "operatorConfig:"
    echo "  image:"
    image_values "$img_operator"
    echo "proxyConfig:"
    echo "  defaultTags: tag:k8s"
    echo "  image:"
    image_values "$img_proxy"
    echo "operatorSettings:"
    for kv in "${settings[@]}"; do
      key=${kv%%=*} value=${kv#*=}
      # The chart's own values for the settings it names.
      case $key in
        OPERATOR_LOGIN_SERVER) login_server=$value ;;
        *) echo "  $key: $(yaml_string "$value")" ;;
      esac
    done
    echo "loginServer: $(yaml_string "${login_server:-}")"
  } > "$overlay/values.yaml"
  chmod 600 "$overlay/values.yaml"

  stage "installing the operator (helm upgrade --install tsingress charts/tailscale-operator -f bin/kind-overlay-$cluster/values.yaml)"
  # The namespace as config/manager makes it: the L3 proxies' privileged init container is allowed.
  # Applied server-side as make deploy applies them, so that either install can follow the other.
  "$kubectl" apply --server-side --force-conflicts -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: tailscale
  labels:
    app.kubernetes.io/name: tsingress
    pod-security.kubernetes.io/enforce: privileged
YAML
  if [ -n "$proxy_ca" ]; then
    "$kubectl" -n tailscale create configmap proxy-ca --from-file="$overlay/$proxy_ca" --dry-run=client -o yaml |
      "$kubectl" apply --server-side --force-conflicts -f - >/dev/null
  fi
  # A cluster make deploy installed before: its Deployment goes (fields kubectl applied, such as
  # render.sh's PROXY_IMAGE, would otherwise stay beside the chart's), with its hashed settings;
  # helm takes over the rest, CRDs included, which must stay for the objects of the last run.
  if "$kubectl" -n tailscale get deployment operator >/dev/null 2>&1 && \
    [ "$("$kubectl" -n tailscale get deployment operator -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')" != Helm ]; then
    "$kubectl" -n tailscale delete deployment operator --wait >/dev/null
    "$kubectl" -n tailscale get configmap -o name | grep '^configmap/operator-settings-' | xargs -r "$kubectl" -n tailscale delete >/dev/null
  fi
  KUBECONFIG=$KUBECONFIG "$helm" upgrade --install tsingress "$root/charts/tailscale-operator" --namespace tailscale \
    -f "$overlay/values.yaml" --take-ownership --force-conflicts >/dev/null
else
  # A cluster the chart installed before: its release goes first (the CRDs stay, the chart keeps
  # them), so that make deploy's apply meets no objects of helm's.
  if [ -n "${HELM:-}" ] && [ -x "$HELM" ] && KUBECONFIG=$KUBECONFIG "$HELM" status tsingress --namespace tailscale >/dev/null 2>&1; then
    stage "removing the chart's release tsingress, which installed the operator before"
    KUBECONFIG=$KUBECONFIG "$HELM" uninstall tsingress --namespace tailscale --wait >/dev/null
    done_stage
  fi
  literals=""
  for kv in "${settings[@]}"; do literals+=$'\n'"  - $kv"; done
  extra_resources=""
  if [ -n "$proxy_ca" ]; then
    extra_resources="- name: proxy-ca
  namespace: tailscale
  files: [$proxy_ca]
  options: {disableNameSuffixHash: true}"
  fi
cat > "$overlay/kustomization.yaml" <<YAML
# Generated by hack/kind-deploy.sh: the operator as make deploy installs it with the restricted
# overlay (kernel-path proxies' Pods in tailscale-privileged), with the run's tailnet.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(realpath --relative-to="$overlay" "$root/config/overlays/restricted")
secretGenerator:
- name: operator-oauth
  namespace: tailscale
  files: [client_id, client_secret]
  options: {disableNameSuffixHash: true}
configMapGenerator:
- name: operator-settings
  namespace: tailscale
  behavior: merge
  literals:
  - PROXY_TAGS=tag:k8s${literals}
${extra_resources}
YAML

  stage "deploying the operator (make deploy OVERLAY=bin/kind-overlay-$cluster, on config/overlays/restricted)"
  make --no-print-directory deploy OVERLAY="$overlay" IMG_OPERATOR="$img_operator" IMG_PROXY="$img_proxy" KUBECTL="$kubectl" >/dev/null
  export E2E_PRIVILEGED_NAMESPACE=tailscale-privileged
fi
# Images loaded again under the same tags reach a running operator only through a new Pod.
"$kubectl" -n tailscale rollout restart deployment/operator >/dev/null
"$kubectl" -n tailscale rollout status deployment/operator --timeout=3m
done_stage
