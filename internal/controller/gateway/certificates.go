package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// certificateRefs resolves the certificateRefs of the Gateway's accepted HTTPS listeners: the
// copies its standalone proxy serves, and the listeners whose refs do not resolve, with the
// spec's reason. On a ProxyGroup they are not served yet.
func (r *GatewayReconciler) certificateRefs(ctx context.Context, gw *gatewayv1.Gateway, view gatewayView, onGroup bool) (certs.BYOCertificates, map[gatewayv1.SectionName]refProblem, error) {
	var byo certs.BYOCertificates
	problems := map[gatewayv1.SectionName]refProblem{}
	par := proxies.ParentOf(proxies.ParentTypeGateway, gw)
	grants := map[string][]gatewayv1.ReferenceGrant{} // by namespace, read once
	for _, l := range view.Listeners {
		if !l.served() || !l.terminatesOwnTLS() {
			continue
		}
		if onGroup {
			problems[l.Name] = refProblem{kit.ReasonInvalidCertificateRef, "certificateRefs are not served on a ProxyGroup yet"}
			continue
		}
		var hosts []string
		if l.Hostname != "" {
			hosts = []string{strings.ToLower(l.Hostname)}
		}
		for _, ref := range l.CertificateRefs {
			key := types.NamespacedName{Namespace: gw.Namespace, Name: string(ref.Name)}
			if ref.Namespace != nil {
				key.Namespace = string(*ref.Namespace)
			}
			if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Secret") {
				problems[l.Name] = refProblem{kit.ReasonInvalidCertificateRef, fmt.Sprintf("certificateRef %s is not a Secret", key)}
				break
			}
			if key.Namespace != gw.Namespace {
				if _, read := grants[key.Namespace]; !read {
					list := &gatewayv1.ReferenceGrantList{}
					if err := r.List(ctx, list, client.InNamespace(key.Namespace)); err != nil {
						return byo, nil, fmt.Errorf("listing the ReferenceGrants of namespace %s: %w", key.Namespace, err)
					}
					grants[key.Namespace] = list.Items
				}
				if !grantedTo(grants[key.Namespace], "Gateway", gw.Namespace, "Secret", key) {
					problems[l.Name] = refProblem{kit.ReasonRefNotPermitted, fmt.Sprintf("no ReferenceGrant in namespace %s lets Gateways of %s use Secret %s", key.Namespace, gw.Namespace, key.Name)}
					break
				}
			}
			f, err := r.Certs.Add(ctx, &byo, key, hosts, false, par.ProxyName(), r.Settings.Namespace, par.Labels())
			if err != nil {
				return byo, nil, err
			}
			if f != nil {
				problems[l.Name] = refProblem{kit.ReasonInvalidCertificateRef, f.Message}
				break
			}
		}
	}
	return byo, problems, nil
}

// withRefProblems marks the listeners whose certificateRefs do not resolve.
func withRefProblems(view gatewayView, problems map[gatewayv1.SectionName]refProblem) gatewayView {
	view.Listeners = slices.Clone(view.Listeners)
	for i := range view.Listeners {
		if p, ok := problems[view.Listeners[i].Name]; ok {
			view.Listeners[i].RefProblem, view.Listeners[i].RefWhy = p.Reason, p.Message
		}
	}
	return view
}

// gatewaysForTLSSecret maps a TLS Secret to the Gateways whose listeners name it.
func (r *GatewayReconciler) gatewaysForTLSSecret(ctx context.Context, o client.Object) []reconcile.Request {
	return r.gateways(ctx, client.MatchingFields{indexGatewayCertificates: client.ObjectKeyFromObject(o).String()})
}

// gatewayCertificateKeys lists the Secrets ("namespace/name") a Gateway's listeners name.
func gatewayCertificateKeys(o client.Object) []string {
	gw := o.(*gatewayv1.Gateway)
	var keys []string
	for _, l := range gw.Spec.Listeners {
		if l.TLS == nil {
			continue
		}
		for _, ref := range l.TLS.CertificateRefs {
			ns := gw.Namespace
			if ref.Namespace != nil {
				ns = string(*ref.Namespace)
			}
			keys = append(keys, ns+"/"+string(ref.Name))
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}
