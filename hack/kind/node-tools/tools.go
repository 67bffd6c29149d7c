//go:build tools

// Package tools pins crictl and kind for the offline kind node image (hack/kind/build-node-image.sh);
// kind's module also carries the node's base files.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/kind"
)
