#!/usr/bin/env bash
# Renders a kustomize overlay with the given images, without editing any committed file: a throwaway
# kustomization in bin/ takes the overlay as its base and sets the operator's image and its
# PROXY_IMAGE. Usage: render.sh KUSTOMIZE OVERLAY OPERATOR_IMAGE PROXY_IMAGE > manifests.yaml
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kustomize=${1:?usage: render.sh KUSTOMIZE OVERLAY OPERATOR_IMAGE PROXY_IMAGE}
overlay=$(cd "${2:?}" && pwd)
operator_image=${3:?}
proxy_image=${4:?}

mkdir -p "$root/bin"
dir=$(mktemp -d "$root/bin/render.XXXXXX")
trap 'rm -rf "$dir"' EXIT
# image REF prints kustomize's newName and newTag (or digest) fields for REF.
image_fields() {
  local ref=$1
  if [[ $ref == *@* ]]; then
    printf '  newName: %s\n  digest: %s\n' "${ref%@*}" "${ref#*@}"
  elif [[ ${ref##*/} == *:* ]]; then
    printf '  newName: %s\n  newTag: "%s"\n' "${ref%:*}" "${ref##*:}"
  else
    printf '  newName: %s\n' "$ref"
  fi
}
cat > "$dir/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(realpath --relative-to="$dir" "$overlay")
images:
- name: ghcr.io/tsingress/operator
$(image_fields "$operator_image")
# A container's own env wins over its envFrom, so this overrides operator-settings' PROXY_IMAGE.
patches:
- target: {kind: Deployment, name: operator}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value: {name: PROXY_IMAGE, value: "$proxy_image"}
YAML
"$kustomize" build "$dir"
