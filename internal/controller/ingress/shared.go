package ingress

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// What both Ingress reconcilers (standalone and HA) use: the decision an Ingress's routes and
// certificates make, its load-balancer status, and the indexes and mappings of their watches.

const (
	indexIngressBackends   = "tsingress.ingress.backends"
	indexIngressTLSSecrets = "tsingress.ingress.tls-secrets"
)

// ingressDecision is what an Ingress asks a proxy (standalone or a group's) to serve.
type ingressDecision struct {
	WS       contract.WebService
	Tags     []string
	Hostname string
	Findings []kit.Finding
}

// DecideIngress decides from what a pass read (the backend Services, the bring-your-own
// certificates) what an Ingress asks to serve, and what stops it or is left out.
func DecideIngress(ing *networkingv1.Ingress, in RouteInputs, byo certs.BYOCertificates, defaultTags []string) ingressDecision {
	d := ingressDecision{Hostname: kit.IngressHostname(ing)}
	if !contract.ValidHostname(d.Hostname) {
		d.Findings = append(d.Findings, kit.Blockf(kit.ReasonInvalidHostname, "tailnet hostname %q (from the first TLS host) is not a valid DNS label", d.Hostname))
	}
	ws, routeFindings := BuildWebService(ing, in)
	ws.TLS.Certificates = byo.Refs
	d.WS = ws
	d.Findings = append(d.Findings, routeFindings...)
	d.Findings = append(d.Findings, byo.Findings...)
	tags, f := proxies.ParseTags(ing, defaultTags)
	if f != nil {
		d.Findings = append(d.Findings, *f)
	}
	d.Tags = tags
	if len(ws.Routes) == 0 {
		d.Findings = append(d.Findings, kit.Blockf(kit.ReasonNoValidBackends, "no path of this Ingress can be served; nothing changed"))
	}
	return d
}

func httpsPorts(http bool) []networkingv1.IngressPortStatus {
	ports := []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP}}
	if http {
		ports = append(ports, networkingv1.IngressPortStatus{Port: 80, Protocol: corev1.ProtocolTCP})
	}
	return ports
}

// byoStatus lists the bring-your-own hosts the proxy serves with a valid certificate. Wildcards
// are left out: a status hostname must be a DNS name, and the API refuses "*.example.com".
func byoStatus(refs []contract.CertificateRef, certs map[string]contract.CertificateStatus, now time.Time) []networkingv1.IngressLoadBalancerIngress {
	var out []networkingv1.IngressLoadBalancerIngress
	for _, ref := range refs {
		for _, h := range ref.Hosts {
			if contract.IsWildcard(h) {
				continue
			}
			if c, ok := certs[h]; ok && c.Valid(now) {
				out = append(out, networkingv1.IngressLoadBalancerIngress{Hostname: h, Ports: httpsPorts(false)})
			}
		}
	}
	return out
}

// IndexIngresses registers the indexes of Ingresses by backend Service and by TLS Secret, which
// the standalone and HA Ingress reconcilers both watch through; Setup calls it once, before
// either, so that neither depends on the other being set up.
func IndexIngresses(mgr ctrl.Manager) error {
	idx, ctx := mgr.GetFieldIndexer(), context.Background()
	if err := idx.IndexField(ctx, &networkingv1.Ingress{}, indexIngressBackends,
		func(o client.Object) []string { return backendServiceNames(o.(*networkingv1.Ingress)) }); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexIngressBackends, err)
	}
	if err := idx.IndexField(ctx, &networkingv1.Ingress{}, indexIngressTLSSecrets,
		func(o client.Object) []string { return TLSSecretNames(o.(*networkingv1.Ingress)) }); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexIngressTLSSecrets, err)
	}
	return nil
}

// ingressesForTLSSecret maps a user's certificate Secret to the Ingresses that serve it.
func ingressesForTLSSecret(c client.Client, keep func(*networkingv1.Ingress) bool) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := &networkingv1.IngressList{}
		if err := c.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressTLSSecrets: o.GetName()}); err != nil {
			return nil
		}
		return ingressRequests(list.Items, keep)
	}
}

func ingressRequests(items []networkingv1.Ingress, keep func(*networkingv1.Ingress) bool) []reconcile.Request {
	var reqs []reconcile.Request
	for i := range items {
		if keep(&items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&items[i])})
		}
	}
	return reqs
}

// backendServices fetches the Services an Ingress routes to; missing ones are left out.
func backendServices(ctx context.Context, c client.Client, ing *networkingv1.Ingress) (map[string]*corev1.Service, error) {
	services := map[string]*corev1.Service{}
	for _, name := range backendServiceNames(ing) {
		svc := &corev1.Service{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: ing.Namespace, Name: name}, svc); {
		case err == nil:
			services[name] = svc
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading backend Service %s/%s: %w", ing.Namespace, name, err)
		}
	}
	return services, nil
}

// setIngressLoadBalancer writes an Ingress's load-balancer status when it changed.
func setIngressLoadBalancer(ctx context.Context, c client.Client, ing *networkingv1.Ingress, want []networkingv1.IngressLoadBalancerIngress) error {
	if equality.Semantic.DeepEqual(ing.Status.LoadBalancer.Ingress, want) {
		return nil
	}
	before := ing.DeepCopy()
	ing.Status.LoadBalancer.Ingress = want
	return kit.PatchStatus(ctx, c, before, ing)
}

// tlsSecretNames lists the Secrets an Ingress's bring-your-own entries name.
func TLSSecretNames(ing *networkingv1.Ingress) []string {
	var names []string
	for _, t := range ing.Spec.TLS {
		if kit.IsBYO(t) {
			names = append(names, t.SecretName)
		}
	}
	return names
}
