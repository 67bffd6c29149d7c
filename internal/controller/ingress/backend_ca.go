package ingress

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// BackendCAKey is the key of the CA bundle in the ConfigMap tailscale.com/backend-ca names, as
// in kube-root-ca.crt and the bundles trust-manager writes.
const BackendCAKey = "ca.crt"

// BackendCA is the CA bundle an Ingress names for its backends.
type BackendCA struct {
	// ConfigMap is its name; "" when the Ingress names none.
	ConfigMap string
	// PEM is the bundle, "" when Problem says why it cannot be used.
	PEM     string
	Problem string
}

// readBackendCA reads the ConfigMap an Ingress names in tailscale.com/backend-ca, through the
// API server: the operator caches ConfigMaps by name only.
func readBackendCA(ctx context.Context, api client.Reader, ing *networkingv1.Ingress) (BackendCA, error) {
	name := ing.Annotations[kit.AnnotationBackendCA]
	if name == "" {
		return BackendCA{}, nil
	}
	ca := BackendCA{ConfigMap: name}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		ca.Problem = fmt.Sprintf("%q is not a ConfigMap name: %s", name, errs[0])
		return ca, nil
	}
	cm := &corev1.ConfigMap{}
	if err := api.Get(ctx, client.ObjectKey{Namespace: ing.Namespace, Name: name}, cm); apierrors.IsNotFound(err) {
		ca.Problem = fmt.Sprintf("ConfigMap %s/%s does not exist", ing.Namespace, name)
		return ca, nil
	} else if err != nil {
		return ca, fmt.Errorf("reading the backend CA ConfigMap %s/%s: %w", ing.Namespace, name, err)
	}
	switch bundle := cm.Data[BackendCAKey]; {
	case bundle == "":
		ca.Problem = fmt.Sprintf("ConfigMap %s/%s has no key %s", ing.Namespace, name, BackendCAKey)
	case !contract.ValidCABundle(bundle):
		ca.Problem = fmt.Sprintf("%s of ConfigMap %s/%s holds no PEM certificate", BackendCAKey, ing.Namespace, name)
	default:
		ca.PEM = bundle
	}
	return ca, nil
}

// backendTLS is how an Ingress's verified https backends are verified.
type backendTLS struct {
	ca         BackendCA
	serverName string // "" for the default
}

// decideBackendTLS reads the backend CA and server name annotations against the backend
// protocol: they apply to verified https backends, and either makes every backend one.
func decideBackendTLS(ing *networkingv1.Ingress, ca BackendCA, protocol string) (backendTLS, string, []kit.Finding) {
	var findings []kit.Finding
	t := backendTLS{ca: ca, serverName: ing.Annotations[kit.AnnotationBackendServerName]}
	if t.serverName != "" && !contract.ValidDNSName(t.serverName) {
		findings = append(findings, kit.Warnf(kit.ReasonInvalidAnnotation, "annotation %s=%q is not a DNS name; verifying backends for their default name",
			kit.AnnotationBackendServerName, t.serverName))
		t.serverName = ""
	}
	switch protocol {
	case "", "https":
		// Naming what to verify against asks for verification, on any port.
		if ca.ConfigMap != "" || t.serverName != "" {
			protocol = "https"
		}
	default:
		for _, a := range []struct{ name, value string }{{kit.AnnotationBackendCA, ca.ConfigMap}, {kit.AnnotationBackendServerName, t.serverName}} {
			if a.value != "" {
				findings = append(findings, kit.Warnf(kit.ReasonInvalidAnnotation, "annotation %s applies to verified https backends, and %s=%s: not used",
					a.name, kit.AnnotationBackendProtocol, protocol))
			}
		}
		t = backendTLS{}
	}
	return t, protocol, findings
}

// verify sets how a verified https backend of Service svc (in namespace) is verified, or says
// why it cannot be: its CA cannot be used.
func (t backendTLS) verify(b *contract.Backend, namespace string, svc *corev1.Service) *kit.Finding {
	if t.ca.Problem != "" {
		f := kit.Warnf(kit.ReasonInvalidBackendCA, "annotation %s: %s; the backend is left out rather than reached unverified", kit.AnnotationBackendCA, t.ca.Problem)
		return &f
	}
	b.CABundle, b.ServerName = t.ca.PEM, t.serverName
	// An ExternalName Service's certificate names its external name, its URL's host.
	if b.ServerName == "" && b.CABundle != "" && svc.Spec.Type != corev1.ServiceTypeExternalName {
		b.ServerName = svc.Name + "." + namespace + ".svc"
	}
	return nil
}

// ingressesForBackendCA maps a ConfigMap to the Ingresses kept by keep that name it as their
// backend CA.
func ingressesForBackendCA(c client.Client, keep func(*networkingv1.Ingress) bool) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := &networkingv1.IngressList{}
		if err := c.List(ctx, list, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		return ingressRequests(list.Items, func(ing *networkingv1.Ingress) bool {
			return ing.Annotations[kit.AnnotationBackendCA] == o.GetName() && keep(ing)
		})
	}
}
