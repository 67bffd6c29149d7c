// Package testenv starts a real Kubernetes control plane for tests: kube-apiserver and etcd
// through envtest, plus kube-controller-manager, so that StatefulSets really get Pods and
// deletions really cascade (or, for tests of one component, the API server alone). The
// binaries come from KUBEBUILDER_ASSETS (`make envtest`).
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tsingress/tsingress/internal/testing/lifeline"
)

// ControlPlane is a running API server, etcd and controller manager.
type ControlPlane struct {
	Config *rest.Config
	// Kubeconfig is a file with admin credentials, for processes such as a proxy.
	Kubeconfig string

	env  *envtest.Environment
	kcm  *exec.Cmd
	dir  string // everything the control plane writes
	life *lifeline.Lifeline
}

// Start runs the control plane with the CRDs in crdDirs installed. Its processes and files go
// with Stop, or with this process however it ends.
func Start(crdDirs ...string) (*ControlPlane, error) {
	return start(crdDirs, true)
}

// StartAPIServer runs etcd and the API server only, as Start does: nothing reconciles what
// the test creates.
func StartAPIServer() (*ControlPlane, error) {
	return start(nil, false)
}

func start(crdDirs []string, controllers bool) (*ControlPlane, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS must point at kube-apiserver, etcd and kube-controller-manager: run the tests with `make test`")
	}
	dir, err := os.MkdirTemp("", "testenv-")
	if err != nil {
		return nil, err
	}
	life, err := lifeline.Start(dir)
	if err != nil {
		_ = os.RemoveAll(dir) // best effort: the lifeline's error is the one to report
		return nil, err
	}
	env := &envtest.Environment{CRDDirectoryPaths: crdDirs, ErrorIfCRDPathMissing: len(crdDirs) > 0}
	cp := &ControlPlane{env: env, dir: dir, life: life}
	// In dir, so that the lifeline finds the processes by their flags, and removes the files.
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(dir, "etcd")}
	api := env.ControlPlane.GetAPIServer()
	api.CertDir = filepath.Join(dir, "apiserver")
	for _, d := range []string{env.ControlPlane.Etcd.DataDir, api.CertDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, errors.Join(err, cp.Stop())
		}
	}
	// Dual-stack, as clusters may be: Services stay IPv4 unless they ask for IPv6.
	api.Configure().Set("service-cluster-ip-range", "10.0.0.0/24,fd00:10:96::/112")
	cfg, err := env.Start()
	// envtest always writes webhook serving certificates to a directory of its own; there are
	// no webhooks here, and the directory would outlive a process killed before Stop.
	if d := env.WebhookInstallOptions.LocalServingCertDir; d != "" {
		_ = os.RemoveAll(d) // best effort: it lies in the temp directory
	}
	if err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	cp.Config = cfg
	if err := cp.writeKubeconfig(); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	if controllers {
		if err := cp.startControllerManager(assets); err != nil {
			return nil, errors.Join(err, cp.Stop())
		}
	}
	return cp, nil
}

// InstallCRDs installs the CRDs in dirs into the running control plane and waits until the API
// serves them: for tests of what happens when CRDs appear after the operator started.
func (cp *ControlPlane) InstallCRDs(dirs ...string) error {
	if _, err := envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{Paths: dirs, ErrorIfPathMissing: true}); err != nil {
		return fmt.Errorf("installing the CRDs of %v: %w", dirs, err)
	}
	return nil
}

// AddUser adds a user of that name and groups, and returns its client config.
func (cp *ControlPlane) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := cp.env.AddUser(envtest.User{Name: name, Groups: groups}, cp.Config)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

func (cp *ControlPlane) writeKubeconfig() error {
	user, err := cp.env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	cp.Kubeconfig = filepath.Join(cp.dir, "kubeconfig")
	return os.WriteFile(cp.Kubeconfig, kubeconfig, 0o600)
}

func (cp *ControlPlane) startControllerManager(assets string) error {
	// The controllers the operator's objects depend on, and the namespace controller, without
	// which a deleted namespace stays Terminating; no service-account tokens controller, which
	// would need a signing key.
	cp.kcm = exec.Command(filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig="+cp.Kubeconfig,
		"--authentication-kubeconfig="+cp.Kubeconfig,
		"--authorization-kubeconfig="+cp.Kubeconfig,
		"--controllers=statefulset,garbagecollector,endpointslice,namespace",
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
	// Stopped by Stop alone, after what depends on it, as envtest does with its processes.
	cp.kcm.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cp.kcm.Start()
	_ = log.Close() // the child has its own descriptor; ours is only let go
	if err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	return nil
}

// Stop ends every process and removes what the control plane wrote.
func (cp *ControlPlane) Stop() error {
	if cp.kcm != nil && cp.kcm.Process != nil {
		_ = cp.kcm.Process.Kill()
		_ = cp.kcm.Wait()
	}
	err := cp.env.Stop()
	return errors.Join(err, os.RemoveAll(cp.dir), cp.life.Close())
}
