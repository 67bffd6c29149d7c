//go:build tools

package tools

import (
	// The envtest control plane (hack/build-envtest.sh).
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	// The rest of a kind node (hack/kind/build-node-image.sh).
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	// The e2e suite's backend image on a machine with no registry (hack/e2e-kind.sh).
	_ "k8s.io/kubernetes/test/images/agnhost"
)
