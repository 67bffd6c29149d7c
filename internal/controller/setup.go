// Package controller holds the operator's reconcilers.
package controller

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// recorderName is the reporting controller of every Event the operator emits.
const recorderName = "tsingress-operator"

// CacheOptions keeps the operator's own children (Secrets, ConfigMaps, Pods, StatefulSets,
// RBAC) cached for its namespace only: caching every Secret of a large cluster would waste
// memory. Users' kubernetes.io/tls Secrets are seen by name only (tlsSecretWatch) and read when
// an Ingress names them. Ingresses, Services and the CRDs are watched cluster-wide, without
// what the operator never reads (managed fields, kubectl's last applied configuration).
func CacheOptions(s Settings) cache.Options {
	own := cache.ByObject{Namespaces: map[string]cache.Config{s.Namespace: {}}}
	return cache.Options{DefaultTransform: stripUnread, ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}:         own,
		&corev1.ConfigMap{}:      own,
		&corev1.Pod{}:            own,
		&corev1.ServiceAccount{}: own,
		&appsv1.StatefulSet{}:    own,
		&rbacv1.Role{}:           own,
		&rbacv1.RoleBinding{}:    own,
	}}
}

// Setup registers every reconciler with the manager. tc is the tailnet's control plane.
func Setup(mgr ctrl.Manager, s Settings, tc tailnet.Client) error {
	rec := mgr.GetEventRecorder(recorderName)
	tlsSecrets, err := newTLSSecretWatch(mgr)
	if err != nil {
		return err
	}
	limits := s.CertificateLimits
	if limits == (acmebudget.Limits{}) {
		limits = acmebudget.LetsEncrypt
	}
	reg := s.Metrics
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m, err := registerOperatorMetrics(reg, mgr.GetClient(), s.Namespace, limits)
	if err != nil {
		return fmt.Errorf("registering the operator's metrics: %w", err)
	}
	// Every field index first: the watches of each reconciler rely on none set up by another.
	if err := indexIngresses(mgr); err != nil {
		return err
	}
	if err := indexGroupObjects(mgr); err != nil {
		return err
	}
	if err := indexCertificateCopies(mgr); err != nil {
		return err
	}
	if err := (&ProxyClassReconciler{Client: mgr.GetClient(), Recorder: rec, Mapper: mgr.GetRESTMapper(), metrics: m}).SetupWithManager(mgr); err != nil {
		return err
	}
	p := &proxies{Client: mgr.GetClient(), api: mgr.GetAPIReader(), settings: s, tailnet: tc}
	certs := certSecrets{api: mgr.GetAPIReader(), now: time.Now}
	guard := &certGuard{Client: mgr.GetClient(), api: mgr.GetAPIReader(), namespace: s.Namespace, limits: limits, now: time.Now}
	if err := (&IngressReconciler{Client: mgr.GetClient(), reporter: m.reporter(rec, "ingress"), Settings: s, certs: certs, guard: guard, tlsSecrets: tlsSecrets}).SetupWithManager(mgr, p); err != nil {
		return err
	}
	if err := (&ServiceReconciler{Client: mgr.GetClient(), reporter: m.reporter(rec, "service"), Settings: s}).SetupWithManager(mgr, p); err != nil {
		return err
	}
	if err := (&ProxyGroupReconciler{Client: mgr.GetClient(), reporter: m.reporter(rec, "proxygroup"), Settings: s, Tailnet: tc}).SetupWithManager(mgr); err != nil {
		return err
	}
	docs := groupDocs{Client: mgr.GetClient(), namespace: s.Namespace, w: newGroupWriter(mgr.GetClient(), mgr.GetAPIReader(), s.Namespace, s.GroupShardBytes)}
	services := &tailscaleServices{Client: mgr.GetClient(), tailnet: tc, settings: s}
	if err := (&HAIngressReconciler{Client: mgr.GetClient(), reporter: m.reporter(rec, "ingress-proxygroup"), Settings: s, certs: certs, guard: guard,
		tlsSecrets: tlsSecrets, info: p.tailnetInfo}).SetupWithManager(mgr, docs, services); err != nil {
		return err
	}
	return (&HAServiceReconciler{Client: mgr.GetClient(), reporter: m.reporter(rec, "service-proxygroup"), Settings: s}).SetupWithManager(mgr, docs, services)
}
