package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// A deleted namespace goes, with what it held, as in a cluster; then Stop leaves no process and
// no file behind.
func TestNamespaceDeletedThenStop(t *testing.T) {
	cp, err := Start()
	stop := stopLater(t, cp, err)
	kube, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "content", Namespace: "doomed"}}
	if _, err := kube.CoreV1().ConfigMaps("doomed").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := kube.CoreV1().Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the namespace is still there 60s after its deletion: %v %v", got.Status, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	dir := cp.dir
	if pids := naming(t, dir); len(pids) < 3 {
		t.Fatalf("processes naming %s while running: %v, want etcd, kube-apiserver and kube-controller-manager", dir, pids)
	}
	stop()
	if pids := naming(t, dir); len(pids) > 0 {
		t.Errorf("processes naming %s after Stop: %v", dir, pids)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s after Stop: %v", dir, err)
	}
}

// stopLater fails the test when the control plane did not start, and stops it at the end of
// the test unless the test calls stop first.
func stopLater(t *testing.T, cp *ControlPlane, err error) (stop func()) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cp.Stop()
		}
	})
	return func() {
		t.Helper()
		stopped = true
		if err := cp.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// naming lists the running processes whose command line names dir.
func naming(t *testing.T, dir string) []string {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, f := range cmdlines {
		b, _ := os.ReadFile(f)
		stat, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "stat"))
		if bytes.Contains(b, []byte(dir+"/")) && !bytes.Contains(stat, []byte(") Z ")) {
			found = append(found, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return found
}

// The API server alone: etcd and kube-apiserver, an admin kubeconfig, users with only the rights
// given them; Stop leaves nothing behind.
func TestAPIServerOnly(t *testing.T) {
	cp, err := StartAPIServer()
	stop := stopLater(t, cp, err)
	dir := cp.dir
	if pids := naming(t, dir); len(pids) != 2 {
		t.Errorf("processes naming %s: %v, want etcd and kube-apiserver", dir, pids)
	}
	admin, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	userCfg, err := cp.AddUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		cfg       *rest.Config
		forbidden bool
	}{{"admin", admin, false}, {"a user without a Role", userCfg, true}} {
		kube, err := kubernetes.NewForConfig(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kube.CoreV1().Secrets("default").List(t.Context(), metav1.ListOptions{})
		if apierrors.IsForbidden(err) != tc.forbidden || (!tc.forbidden && err != nil) {
			t.Errorf("%s lists Secrets: %v, want forbidden %v", tc.name, err, tc.forbidden)
		}
	}
	stop()
	if pids := naming(t, dir); len(pids) > 0 {
		t.Errorf("processes naming %s after Stop: %v", dir, pids)
	}
}
