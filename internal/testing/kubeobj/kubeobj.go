// Package kubeobj builds the Kubernetes objects that tests of the operator start from, in one
// place for the unit, envtest and integration suites.
package kubeobj

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/controller/certs"
)

// Service is a Service named name in namespace "default" with a ClusterIP and ports.
func Service(name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}

// Backend is an Ingress backend to Service name at port, a number (int) or a port name (string).
func Backend(name string, port any) networkingv1.IngressBackend {
	b := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name}}
	switch p := port.(type) {
	case int:
		b.Service.Port.Number = int32(p)
	case string:
		b.Service.Port.Name = p
	}
	return b
}

// Path is an Ingress path of type typ to backend b.
func Path(p string, typ networkingv1.PathType, b networkingv1.IngressBackend) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{Path: p, PathType: &typ, Backend: b}
}

// Rule is an Ingress rule for host ("" for any) with paths.
func Rule(host string, paths ...networkingv1.HTTPIngressPath) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}
}

// TLSSecretReaderBinding lets subject (the operator) read the TLS Secrets of namespace, as
// docs/security.md tells a namespace's owner to do for bring-your-own certificates.
func TLSSecretReaderBinding(namespace string, subject rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "tsingress-tls-secrets"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: certs.TLSSecretReaderRole},
		Subjects:   []rbacv1.Subject{subject},
	}
}
