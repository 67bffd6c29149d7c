package controller

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
)

// generatedRBAC binds the ClusterRole and the Role of the operator's namespace that
// config/rbac/role.yaml holds (as make manifests generates them from the markers) to a new user
// for the spec, and returns that user's config and a client of it.
func generatedRBAC(user string) (*rest.Config, client.Client) {
	userCfg, as, objs := bindGeneratedRBAC(user)
	for _, obj := range objs {
		DeferCleanup(k8s.Delete, ctx, obj)
	}
	return userCfg, as
}

// bindGeneratedRBAC binds the generated RBAC to a new user and returns the objects it made.
func bindGeneratedRBAC(user string) (*rest.Config, client.Client, []client.Object) {
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
	Expect(err).NotTo(HaveOccurred())
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	var kinds []string
	var made []client.Object
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		Expect(yaml.Unmarshal([]byte(doc), &meta)).To(Succeed())
		kinds = append(kinds, meta.Kind)
		switch meta.Kind {
		case "ClusterRole":
			role := &rbacv1.ClusterRole{}
			Expect(yaml.Unmarshal([]byte(doc), role)).To(Succeed())
			role.ObjectMeta = metav1.ObjectMeta{Name: user}
			binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user}}
			for _, obj := range []client.Object{role, binding} {
				Expect(k8s.Create(ctx, obj)).To(Succeed())
				made = append(made, obj)
			}
		case "Role":
			role := &rbacv1.Role{}
			Expect(yaml.Unmarshal([]byte(doc), role)).To(Succeed())
			Expect(role.Namespace).To(Equal("system"), "the operator's namespace, which kustomize sets")
			role.ObjectMeta = metav1.ObjectMeta{Name: user, Namespace: testSetup.Namespace}
			binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: testSetup.Namespace}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user}}
			for _, obj := range []client.Object{role, binding} {
				Expect(k8s.Create(ctx, obj)).To(Succeed())
				made = append(made, obj)
			}
		}
	}
	Expect(kinds).To(ConsistOf("ClusterRole", "Role"))
	userCfg, err := cp.AddUser(user)
	Expect(err).NotTo(HaveOccurred())
	as, err := client.New(userCfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error {
		return as.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: "any"}, &corev1.Secret{})
	}).Should(Satisfy(apierrors.IsNotFound), "RBAC bindings take effect after a moment")
	return userCfg, as, made
}

// operatorUser is the user the suite's operator runs as, bound to the generated RBAC.
const operatorUser = "tsingress-operator"

// createTLSSecretReaderRole creates the ClusterRole config/rbac installs for namespaces' owners
// to bind, as it is written there.
func createTLSSecretReaderRole() {
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "tls_secret_reader_role.yaml"))
	Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{}
	Expect(yaml.Unmarshal(b, role)).To(Succeed())
	Expect(k8s.Create(ctx, role)).To(Succeed())
}

// allowTLSSecrets lets the operator read the TLS Secrets of ns, as a namespace's owner does.
func allowTLSSecrets(ns string) {
	Expect(k8s.Create(ctx, kubeobj.TLSSecretReaderBinding(ns,
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: operatorUser}))).To(Succeed())
}

// The operator's RBAC as make manifests generates it: what it needs and nothing wider.
var _ = Describe("The operator's generated RBAC", func() {
	It("reads its own Namespace by name, lists Namespaces (for routes' labels) but writes none, and reads no Secret elsewhere", func() {
		userCfg, as := generatedRBAC("rbac-namespace")
		Expect(as.Get(ctx, client.ObjectKey{Name: testSetup.Namespace}, &corev1.Namespace{})).To(Succeed())
		other := newNamespace()
		err := as.Get(ctx, client.ObjectKey{Name: other}, &corev1.Namespace{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "reading another Namespace by name: want Forbidden, got %v", err)
		// The Gateway API controllers watch Namespaces' metadata: listeners select routes' namespaces by label.
		Expect(as.List(ctx, &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NamespaceList"}})).To(Succeed())
		n := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: other}, n)).To(Succeed())
		before := n.DeepCopy()
		n.Labels["rbac"] = "changed"
		err = as.Patch(ctx, n, client.MergeFrom(before))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "labelling a Namespace: want Forbidden, got %v", err)

		By("reading no Secret outside its namespace, and listing none cluster-wide")
		err = as.Get(ctx, client.ObjectKey{Namespace: other, Name: "any"}, &corev1.Secret{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "reading a Secret of another namespace: want Forbidden, got %v", err)
		err = as.List(ctx, &corev1.SecretList{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing Secrets: want Forbidden, got %v", err)

		By("claiming a Tailscale Service, which needs the operator's ID (its namespace's UID), through a cache as the manager's")
		opts := CacheOptions(testSetup)
		opts.Scheme = scheme
		c, err := cache.New(userCfg, opts)
		Expect(err).NotTo(HaveOccurred())
		cacheCtx, stop := context.WithCancel(ctx)
		DeferCleanup(stop)
		go func() { _ = c.Start(cacheCtx) }()
		cached, err := client.New(userCfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: c}})
		Expect(err).NotTo(HaveOccurred())
		store := groupstore.NewStore(cached, as, tsClient, testSetup)
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "rbac", UID: types.UID("rbac-uid")}}
		claimCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = store.ClaimService(claimCtx, "Ingress", ing, "svc:rbac-namespace", []string{"tcp:443"}, []string{"tag:k8s"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(tsClient.DeleteService, ctx, "svc:rbac-namespace")
	})

	It("writes and binds the proxies' Roles without escalate or bind, and cannot grant what it does not hold", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "rbac", nil)
		DeferCleanup(k8s.Delete, ctx, ing)
		pg := newProxyGroup("rbac", func(pg *tsv1alpha1.ProxyGroup) { pg.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		_, as := generatedRBAC("rbac-roles")

		for i, key := range []client.ObjectKey{proxyKey(proxies.ParentTypeIngress, ing), nsKey(pg.Name)} {
			made := &rbacv1.Role{}
			Eventually(func() error { return k8s.Get(ctx, key, made) }).Should(Succeed(), "the Role the operator made for %s", key.Name)
			role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "rbac-copy-" + key.Name, Namespace: testSetup.Namespace}, Rules: made.Rules}
			Expect(as.Create(ctx, role)).To(Succeed(), "Role %d as the operator builds it", i)
			DeferCleanup(k8s.Delete, ctx, role)
			binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: testSetup.Namespace},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: key.Name, Namespace: testSetup.Namespace}}}
			Expect(as.Create(ctx, binding)).To(Succeed())
			DeferCleanup(k8s.Delete, ctx, binding)
		}

		By("a Role granting what the operator does not hold, and a binding to such a Role")
		wider := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "rbac-wider", Namespace: testSetup.Namespace},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create"}}}}
		err := as.Create(ctx, wider)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "creating a Role wider than the operator's: want Forbidden, got %v", err)
		Expect(k8s.Create(ctx, wider)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, wider)
		err = as.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rbac-wider", Namespace: testSetup.Namespace},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: wider.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: testSetup.Namespace}}})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "binding a Role wider than the operator's: want Forbidden, got %v", err)
	})
})
