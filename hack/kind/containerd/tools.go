//go:build tools

// Package tools pins the containerd of the offline kind node image (hack/kind/build-node-image.sh),
// in a module of its own: its Kubernetes CRI dependency must stay at the version it was released with.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
