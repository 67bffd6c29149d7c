package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
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
	httpEndpointEnabled    = "enabled"
	httpEndpointDisabled   = "disabled"
	// AnnotationFunnel ("true") also serves an Ingress's tailnet name to the internet through
	// Tailscale Funnel, once the tailnet's policy grants the proxies' tags the funnel attribute.
	AnnotationFunnel = "tailscale.com/funnel"
	// AnnotationBackendProtocol forces the scheme of every backend of an Ingress: "http",
	// "https" or "https-insecure" (https without certificate verification). Without it a
	// backend on port 443 or a port named https is https-insecure, anything else http.
	AnnotationBackendProtocol = "tailscale.com/backend-protocol"
	// LabelProxyClass (label, or annotation of the same name) picks a ProxyClass.
	LabelProxyClass = "tailscale.com/proxy-class"

	FinalizerName = "tailscale.com/finalizer"
)

// Labels on every child object. Children live in the operator's namespace, so they cannot be
// owner-referenced by a namespaced parent elsewhere; these labels lead back to it.
const (
	LabelManaged        = "tailscale.com/managed"
	LabelParentName     = "tailscale.com/parent-resource"
	LabelParentNS       = "tailscale.com/parent-resource-ns"
	LabelParentType     = "tailscale.com/parent-resource-type"
	LabelSecretType     = "tailscale.com/secret-type"
	parentTypeIngress   = "ingress"
	parentTypeService   = "svc"
	secretTypeConfState = "config-state"
	// labelIngress marks objects of one Ingress among a ProxyGroup's children (hashLabel of
	// namespace/name: a label value cannot hold both names).
	labelIngress = "tailscale.com/ingress"
)

// hashLabel is a short, label-safe digest of s.
func hashLabel(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

// parent identifies the user object a proxy serves.
type parent struct {
	typ, namespace, name string
}

func parentOf(typ string, obj client.Object) parent {
	return parent{typ: typ, namespace: obj.GetNamespace(), name: obj.GetName()}
}

func (p parent) labels() map[string]string {
	return map[string]string{
		LabelManaged:    "true",
		LabelParentName: p.name,
		LabelParentNS:   p.namespace,
		LabelParentType: p.typ,
	}
}

// maxStatefulSetName keeps the Pod's controller-revision-hash label value (name + "-" + 10
// characters) within the 63 characters a label value allows.
const maxStatefulSetName = 52

// proxyName is the stable name of a parent's proxy StatefulSet (and prefix of its other
// children): readable, unique per parent (a hash of the full identity is appended), and
// short enough for every Kubernetes name it is used in.
func (p parent) proxyName() string {
	sum := sha256.Sum256([]byte(p.typ + "/" + p.namespace + "/" + p.name))
	suffix := hex.EncodeToString(sum[:])[:8]
	base := dnsLabelish(fmt.Sprintf("ts-%s-%s", p.namespace, p.name))
	if max := maxStatefulSetName - len(suffix) - 1; len(base) > max {
		base = strings.TrimRight(base[:max], "-.")
	}
	return base + "-" + suffix
}

// replicas names the children of a parent's proxy, a single replica.
func (p parent) replicas() replicaSet { return replicaSet{name: p.proxyName()} }

// dnsLabelish lowercases s and replaces what a DNS label cannot hold (dots, in particular) with
// dashes.
func dnsLabelish(s string) string {
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
