package ingress

import (
	networkingv1 "k8s.io/api/networking/v1"

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
