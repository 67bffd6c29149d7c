// Package testenv starts a real Kubernetes control plane for tests: kube-apiserver and etcd
// through envtest, plus kube-controller-manager, so that StatefulSets really get Pods and
// deletions really cascade. The binaries come from KUBEBUILDER_ASSETS (`make envtest`).
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControlPlane is a running API server, etcd and controller manager.
type ControlPlane struct {
	Config *rest.Config
	// Kubeconfig is a file with admin credentials, for processes such as a proxy.
	Kubeconfig string

	env *envtest.Environment
	kcm *exec.Cmd
	dir string
}

// Start runs the control plane with the CRDs in crdDirs installed.
func Start(crdDirs ...string) (*ControlPlane, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS must point at kube-apiserver, etcd and kube-controller-manager: run the tests with `make test`")
	}
	env := &envtest.Environment{CRDDirectoryPaths: crdDirs, ErrorIfCRDPathMissing: len(crdDirs) > 0}
	// Dual-stack, as clusters may be: Services stay IPv4 unless they ask for IPv6.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.0.0.0/24,fd00:10:96::/112")
	cfg, err := env.Start()
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Config: cfg, env: env}
	if err := cp.startControllerManager(assets); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) startControllerManager(assets string) error {
	user, err := cp.env.AddUser(envtest.User{Name: "controller-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	if cp.dir, err = os.MkdirTemp("", "testenv-"); err != nil {
		return err
	}
	cp.Kubeconfig = filepath.Join(cp.dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kubeconfig, 0o600); err != nil {
		return err
	}
	// Only the controllers the operator's objects depend on; no service-account tokens
	// controller, which would need a signing key.
	cp.kcm = exec.Command(filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig="+cp.Kubeconfig,
		"--authentication-kubeconfig="+cp.Kubeconfig,
		"--authorization-kubeconfig="+cp.Kubeconfig,
		"--controllers=statefulset,garbagecollector,endpointslice",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--concurrent-statefulset-syncs=5",
	)
	log, err := os.Create(filepath.Join(cp.dir, "kube-controller-manager.log"))
	if err != nil {
		return err
	}
	cp.kcm.Stdout, cp.kcm.Stderr = log, log
	if err := cp.kcm.Start(); err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	return nil
}

// Stop ends every process and removes temporary files.
func (cp *ControlPlane) Stop() error {
	if cp.kcm != nil && cp.kcm.Process != nil {
		_ = cp.kcm.Process.Kill()
		_ = cp.kcm.Wait()
	}
	err := cp.env.Stop()
	if cp.dir != "" {
		os.RemoveAll(cp.dir)
	}
	return err
}
