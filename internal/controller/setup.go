// Package controller wires the operator together: Setup builds each reconciler from the packages
// below it (kit, certs, proxies, groupstore, and one package per reconciler) and registers the
// operator's metrics. Its tests run every reconciler against a real API server (envtest).
package controller

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/fields"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/gateway"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/ingress"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/controller/proxyclass"
	"github.com/tsingress/tsingress/internal/controller/proxygroup"
	"github.com/tsingress/tsingress/internal/controller/service"
	"github.com/tsingress/tsingress/internal/controller/tailnets"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// recorderName is the reporting controller of every Event the operator emits.
const recorderName = "tsingress-operator"

// CacheOptions keeps the operator's own children (Secrets, ConfigMaps, Pods, StatefulSets,
// RBAC) cached for its namespace only: caching every Secret of a large cluster would waste
// memory. Users' kubernetes.io/tls Secrets (in the namespaces that let the operator read them)
// and ConfigMaps are seen by name only (kit.NamespaceNameWatch, kit.NameWatch) and read when an
// Ingress names them. Ingresses, Services and the CRDs are watched cluster-wide, without what
// the operator never reads (managed fields, kubectl's last applied configuration).
func CacheOptions(s kit.Settings) cache.Options {
	own := cache.ByObject{Namespaces: map[string]cache.Config{s.Namespace: {}}}
	// Proxy Pods, and what runs them, also where kernel-path proxies run apart.
	pods := cache.ByObject{Namespaces: map[string]cache.Config{}}
	for _, ns := range s.PodNamespaces() {
		pods.Namespaces[ns] = cache.Config{}
	}
	return cache.Options{DefaultTransform: kit.StripUnread, ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}:         own,
		&corev1.ConfigMap{}:      pods, // the CA bundle's copy
		&corev1.Pod{}:            pods,
		&corev1.ServiceAccount{}: pods,
		&appsv1.StatefulSet{}:    pods,
		&rbacv1.Role{}:           own,
		&rbacv1.RoleBinding{}:    own,
	}}
}

// Setup registers every reconciler with the manager. tc is the tailnet's control plane.
func Setup(mgr ctrl.Manager, s kit.Settings, tc tailnet.Client) error {
	rec := mgr.GetEventRecorder(recorderName)
	c, api := kit.QuietSecrets(mgr.GetClient(), mgr.GetAPIReader())
	tlsSecrets, err := kit.NewNamespaceNameWatch(mgr, corev1.SchemeGroupVersion.WithKind("Secret"),
		fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)))
	if err != nil {
		return fmt.Errorf("watching kubernetes.io/tls Secrets: %w", err)
	}
	backendCAs, err := kit.NewNameWatch(mgr, corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	if err != nil {
		return fmt.Errorf("watching ConfigMaps, for Ingresses' backend CAs: %w", err)
	}
	limits := s.CertificateLimits
	if limits == (acmebudget.Limits{}) {
		limits = acmebudget.LetsEncrypt
	}
	reg := s.Metrics
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m, err := registerOperatorMetrics(reg, c, s.Namespace, limits)
	if err != nil {
		return fmt.Errorf("registering the operator's metrics: %w", err)
	}
	// Every field index first: the watches of each reconciler rely on none set up by another.
	if err := ingress.IndexIngresses(mgr); err != nil {
		return fmt.Errorf("indexing Ingresses: %w", err)
	}
	if err := groupstore.IndexGroupObjects(mgr); err != nil {
		return fmt.Errorf("indexing the objects served by ProxyGroups: %w", err)
	}
	if err := certs.IndexCertificateCopies(mgr); err != nil {
		return fmt.Errorf("indexing the certificate copies: %w", err)
	}
	if err := (&tailnets.TailnetReconciler{Client: c, Reporter: m.Reporter(rec, "tailnet")}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Tailnet controller: %w", err)
	}
	if err := (&proxyclass.ProxyClassReconciler{Client: c, Reporter: m.Reporter(rec, "proxyclass"), Mapper: mgr.GetRESTMapper()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxyClass controller: %w", err)
	}
	p := &proxies.Proxies{Client: c, API: api, Settings: s, Tailnet: tc}
	certSecrets := certs.CertSecrets{API: api, Now: time.Now, Watches: tlsSecrets}
	guard := &certs.CertGuard{Client: c, API: api, Namespace: s.Namespace, Limits: limits, Now: time.Now}
	if err := (&ingress.IngressReconciler{Client: c, Reporter: m.Reporter(rec, "ingress"), Settings: s, Certs: certSecrets, Guard: guard, TLSSecrets: tlsSecrets, BackendCAs: backendCAs}).SetupWithManager(mgr, p); err != nil {
		return fmt.Errorf("setting up the Ingress controller: %w", err)
	}
	if err := (&service.ServiceReconciler{Client: c, Reporter: m.Reporter(rec, "service"), Settings: s}).SetupWithManager(mgr, p); err != nil {
		return fmt.Errorf("setting up the Service controller: %w", err)
	}
	// One store, so that the three reconcilers of ProxyGroups share its caches.
	store := groupstore.NewStore(c, api, tc, s)
	if err := (&proxygroup.ProxyGroupReconciler{Client: c, Reporter: m.Reporter(rec, "proxygroup"), Settings: s, Tailnet: tc, API: api, Store: store}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxyGroup controller: %w", err)
	}
	if err := (&ingress.HAIngressReconciler{Client: c, Reporter: m.Reporter(rec, "ingress-proxygroup"), Settings: s, Certs: certSecrets, Guard: guard,
		TLSSecrets: tlsSecrets, BackendCAs: backendCAs, Info: p.TailnetInfo}).SetupWithManager(mgr, store); err != nil {
		return fmt.Errorf("setting up the ProxyGroup Ingress controller: %w", err)
	}
	if err := (&service.HAServiceReconciler{Client: c, Reporter: m.Reporter(rec, "service-proxygroup"), Settings: s}).SetupWithManager(mgr, store); err != nil {
		return fmt.Errorf("setting up the ProxyGroup Service controller: %w", err)
	}
	serving := &gateway.Serving{Settings: s, Proxies: p, Groups: store, Guard: guard, Certs: certSecrets, TLSSecrets: tlsSecrets, Gateways: m.Reporter(rec, "gateway"), Routes: m.Reporter(rec, "httproute"), GRPCRoutes: m.Reporter(rec, "grpcroute")}
	if err := gateway.Setup(mgr, m.Reporter(rec, "gatewayclass"), serving); err != nil {
		return fmt.Errorf("setting up the Gateway API controllers: %w", err)
	}
	return nil
}
