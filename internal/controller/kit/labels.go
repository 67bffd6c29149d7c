package kit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// User-facing annotations and labels, named as in the original operator so that existing
// manifests keep working.
const (
	AnnotationExpose       = "tailscale.com/expose"
	AnnotationHostname     = "tailscale.com/hostname"
	AnnotationTags         = "tailscale.com/tags"
	AnnotationProxyGroup   = "tailscale.com/proxy-group"
	AnnotationHTTPRedirect = "tailscale.com/http-redirect"
	// AnnotationHTTPEndpoint "enabled" serves an Ingress over plain HTTP on port 80 too, with
	// the same routes; it takes priority over AnnotationHTTPRedirect.
	AnnotationHTTPEndpoint = "tailscale.com/http-endpoint"
	HTTPEndpointEnabled    = "enabled"
	HTTPEndpointDisabled   = "disabled"
	// AnnotationFunnel ("true") also serves an Ingress's tailnet name to the internet through
	// Tailscale Funnel, once the tailnet's policy grants the proxies' tags the funnel attribute.
	AnnotationFunnel = "tailscale.com/funnel"
	// AnnotationBackendProtocol forces the protocol of every backend of an Ingress: "http",
	// "https", "https-insecure" (https without certificate verification) or "h2c" (HTTP/2
	// without TLS, as gRPC servers speak). Without it a backend on port 443 or a port named
	// https is https-insecure, one whose port's appProtocol is kubernetes.io/h2c is h2c,
	// anything else http.
	AnnotationBackendProtocol = "tailscale.com/backend-protocol"
	// AnnotationAcceptAppCaps lists, comma-separated, the app capabilities
	// ("example.com/cap/admin") the proxy passes an Ingress's backends in the
	// Tailscale-App-Capabilities header, of those the tailnet policy grants the caller.
	AnnotationAcceptAppCaps = "tailscale.com/accept-app-caps"
	// AnnotationBackendCA names a ConfigMap in an Ingress's namespace whose ca.crt (PEM) is
	// the CA its backends' certificates must chain to: every backend is reached over TLS and
	// verified for its Service's name, <service>.<namespace>.svc.
	AnnotationBackendCA = "tailscale.com/backend-ca"
	// AnnotationBackendServerName is the name the certificates of an Ingress's verified https
	// backends are verified for, in place of that default.
	AnnotationBackendServerName = "tailscale.com/backend-server-name"
	// AnnotationProxyProtocol ("v1" or "v2", or "1" or "2") makes an L3 Service's proxy open
	// each connection to the Service with a PROXY protocol header naming the client's tailnet
	// address: its ports are relayed in userspace rather than DNATed. v2 also prefixes each UDP
	// datagram; v1 has no UDP form.
	AnnotationProxyProtocol = "tailscale.com/proxy-protocol"
	// LabelProxyClass (label, or annotation of the same name) picks a ProxyClass.
	LabelProxyClass = "tailscale.com/proxy-class"

	FinalizerName = "tailscale.com/finalizer"
)

// Labels on every child object. Children live in the operator's namespace, so they cannot be
// owner-referenced by a namespaced parent elsewhere; these labels lead back to it.
const (
	LabelManaged    = "tailscale.com/managed"
	LabelParentName = "tailscale.com/parent-resource"
	LabelParentNS   = "tailscale.com/parent-resource-ns"
	LabelParentType = "tailscale.com/parent-resource-type"
	LabelSecretType = "tailscale.com/secret-type"

	// LabelIngress marks objects of one Ingress among a ProxyGroup's children (hashLabel of
	// namespace/name: a label value cannot hold both names).
	LabelIngress = "tailscale.com/ingress"
)

// HashLabel is a short, label-safe digest of s.
func HashLabel(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

// MaxStatefulSetName keeps the Pod's controller-revision-hash label value (name + "-" + 10
// characters) within the 63 characters a label value allows.
const MaxStatefulSetName = 52

// dnsLabelish lowercases s and replaces what a DNS label cannot hold (dots, in particular) with
// dashes.
func DNSLabelish(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, s)
}

// IngressHostname is the tailnet hostname of an Ingress: the first label of its first TLS host,
// else <namespace>-<name>-ingress.
func IngressHostname(ing *networkingv1.Ingress) string {
	if h := TLSHost(ing); h != "" {
		return strings.ToLower(strings.SplitN(h, ".", 2)[0])
	}
	return TruncateLabel(DNSLabelish(ing.Namespace + "-" + ing.Name + "-ingress"))
}

func HAServiceHostname(s *corev1.Service) string {
	if h := s.Annotations[AnnotationHostname]; h != "" {
		return h
	}
	return TruncateLabel(DNSLabelish(s.Namespace + "-" + s.Name))
}

// ParentRequests maps a child object to its parent through the parent labels.
func ParentRequests(typ string) handler.MapFunc {
	return func(_ context.Context, o client.Object) []reconcile.Request {
		l := o.GetLabels()
		if l[LabelManaged] != "true" || l[LabelParentType] != typ {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: l[LabelParentNS], Name: l[LabelParentName]}}}
	}
}

// tlsHost is the first host of the first TLS entry that is not a bring-your-own certificate's.
func TLSHost(ing *networkingv1.Ingress) string {
	for _, t := range ing.Spec.TLS {
		if !IsBYO(t) && len(t.Hosts) > 0 {
			return t.Hosts[0]
		}
	}
	return ""
}

// IsBYO reports whether a TLS entry brings its own certificate: it names a Secret and its hosts
// are custom domains. Entries without a Secret, or for tailnet names, are served by ACME as in
// the original operator, which ignores secretName.
func IsBYO(t networkingv1.IngressTLS) bool {
	return t.SecretName != "" && len(t.Hosts) > 0 && CustomHost(t.Hosts[0])
}

// CustomHost reports whether an Ingress TLS host is a custom domain, served with a
// bring-your-own certificate, rather than a tailnet name: it has a dot and is not under ts.net.
func CustomHost(h string) bool {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	return strings.Contains(h, ".") && !strings.HasSuffix(h, ".ts.net")
}

// LoadBalancerClass selects the operator for a LoadBalancer Service.
const LoadBalancerClass = "tailscale"
