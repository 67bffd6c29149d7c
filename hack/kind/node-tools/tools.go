//go:build tools

// Package tools pins what the offline kind node image is built from (hack/kind/build-node-image.sh):
// containerd and crictl, and kind itself, whose module carries the node's base files.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/kind"
)
