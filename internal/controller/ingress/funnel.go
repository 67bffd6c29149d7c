package ingress

import (
	networkingv1 "k8s.io/api/networking/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// setFunnelPortError sets, on fqdn's entry, the error of port 443 while the proxies serving it
// say why it is not served to the internet.
func setFunnelPortError(lb []networkingv1.IngressLoadBalancerIngress, fqdn string, states []*contract.ProxyState) {
	_, problem := kit.FunnelOutcome(fqdn, states) // no problem while public
	if reason, _ := kit.FunnelProblem(fqdn, nil, problem); reason != "" {
		setPortError(lb, fqdn, reason)
	}
}

// wantsFunnel reports whether an Ingress asks to be served to the internet.
func wantsFunnel(ing *networkingv1.Ingress) bool {
	on, _ := kit.ParseFunnel(ing.Annotations, "Ingress", ing.Namespace, true)
	return on
}

// setPortError sets the error of port 443 of the entry for hostname.
func setPortError(lb []networkingv1.IngressLoadBalancerIngress, hostname, reason string) {
	for i := range lb {
		if lb[i].Hostname != hostname {
			continue
		}
		for j := range lb[i].Ports {
			if lb[i].Ports[j].Port == 443 && lb[i].Ports[j].Error == nil {
				lb[i].Ports[j].Error = &reason
			}
		}
	}
}

// groupTags are the tags of a ProxyGroup's replicas.
func groupTags(pg *tsv1alpha1.ProxyGroup, defaults []string) []string {
	if len(pg.Spec.Tags) == 0 {
		return defaults
	}
	tags := make([]string, len(pg.Spec.Tags))
	for i, t := range pg.Spec.Tags {
		tags[i] = string(t)
	}
	return tags
}
