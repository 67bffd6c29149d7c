// Package proxytest holds what the proxy's tests share: a real kube-apiserver and etcd
// (envtest), and a certificate authority standing in for the ACME flow.
package proxytest

import (
	"context"
	"os"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tsingress/tsingress/internal/testing/testenv"
)

// Kube is a running apiserver with a client for it.
type Kube struct {
	cp     *testenv.ControlPlane
	Config *rest.Config
	Client kubernetes.Interface
	// KubeConfig is a kubeconfig file's content for the apiserver.
	KubeConfig []byte
}

// StartKube runs an apiserver for the test. It fails the test, rather than skipping it, when
// KUBEBUILDER_ASSETS is unset: CI always sets it, so a skip would hide a broken setup.
func StartKube(t testing.TB) *Kube {
	t.Helper()
	cp, err := testenv.StartAPIServer()
	if err != nil {
		t.Fatalf("starting the apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the apiserver: %v", err)
		}
	})
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := os.ReadFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return &Kube{cp: cp, Config: cp.Config, Client: cs, KubeConfig: kubeconfig}
}

// Secret creates a Secret with data in namespace, creating the namespace if needed.
func (e *Kube) Secret(t testing.TB, namespace, name string, data map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	_, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = e.Client.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: data,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// ProxyUser returns the config of a user allowed only what the operator grants a proxy: get,
// list, watch and patch of the one Secret.
func (e *Kube) ProxyUser(t testing.TB, namespace, secret string) *rest.Config {
	t.Helper()
	return e.User(t, namespace, "proxy-"+secret, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"},
		ResourceNames: []string{secret}, Verbs: []string{"get", "list", "watch", "patch"}})
}

// User returns the config of a user named name allowed only what rules allow in namespace,
// through a Role and a RoleBinding of that name.
func (e *Kube) User(t testing.TB, namespace, name string, rules ...rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: rules}
	if _, err := e.Client.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}
	if _, err := e.Client.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := e.cp.AddUser(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) > 0 {
		waitAllowed(t, cfg, namespace, rules[0])
	}
	return cfg
}

// waitAllowed waits until the apiserver's authorizer, which learns of new Roles from its own
// cache, allows what rule grants: a proxy started earlier was refused at first under load and
// backed off past its test's deadline.
func waitAllowed(t testing.TB, cfg *rest.Config, namespace string, rule rbacv1.PolicyRule) {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	attrs := &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: rule.Verbs[0], Resource: rule.Resources[0]}
	if len(rule.APIGroups) > 0 {
		attrs.Group = rule.APIGroups[0]
	}
	if len(rule.ResourceNames) > 0 {
		attrs.Name = rule.ResourceNames[0]
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(),
			&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: attrs}}, metav1.CreateOptions{})
		if err == nil && res.Status.Allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Role of %+v did not take effect in 30s: %v", attrs, err)
		}
	}
}
