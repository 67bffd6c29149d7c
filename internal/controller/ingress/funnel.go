package ingress

import (
	"strconv"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// funnelOutcome judges what the proxies serving fqdn report about Funnel: public while one of
// them takes Funnel connections for it, else the first problem one reports (none yet: zero).
func funnelOutcome(fqdn string, states []*contract.ProxyState) (public bool, problem contract.FunnelStatus) {
	for _, st := range states {
		if st == nil {
			continue
		}
		fs, ok := st.Funnel[fqdn]
		switch {
		case !ok:
		case fs.Public:
			return true, contract.FunnelStatus{}
		case problem.Reason == "":
			problem = fs
		}
	}
	return false, problem
}

// reportFunnel reports, for an Ingress that asks for Funnel, whether its tailnet name fqdn is served
// to the internet: a step of progress once it is, a Warning while the proxies (tagged tags) say
// why not.
func reportFunnel(r kit.Reporter, ing *networkingv1.Ingress, fqdn string, tags []string, states []*contract.ProxyState) {
	public, problem := funnelOutcome(fqdn, states)
	switch {
	case public:
		r.Progress(ing, "funnel", kit.ReasonFunnelEnabled, "serving https://%s to the internet through Funnel", fqdn)
	case problem.Reason == contract.FunnelNotPermitted:
		quoted := make([]string, len(tags))
		for i, t := range tags {
			quoted[i] = strconv.Quote(t)
		}
		r.Warning(ing, kit.ReasonFunnelNotPermitted,
			"https://%s is not served to the internet: the tailnet does not let the proxies (tags %s) use Funnel; its policy needs "+
				`{"target": [%s], "attr": ["funnel"]} in nodeAttrs, and HTTPS on (the proxy says: %s)`,
			fqdn, strings.Join(tags, ","), strings.Join(quoted, ", "), problem.Message)
	case problem.Reason != "":
		r.Warning(ing, kit.ReasonFunnelFailed, "https://%s is not served to the internet: %s", fqdn, problem.Message)
	}
}

// setFunnelPortError sets, on fqdn's entry, the error of port 443 while the proxies serving it
// say why it is not served to the internet.
func setFunnelPortError(lb []networkingv1.IngressLoadBalancerIngress, fqdn string, states []*contract.ProxyState) {
	public, problem := funnelOutcome(fqdn, states)
	switch {
	case public || problem.Reason == "":
	case problem.Reason == contract.FunnelNotPermitted:
		setPortError(lb, fqdn, kit.ReasonFunnelNotPermitted)
	default:
		setPortError(lb, fqdn, kit.ReasonFunnelFailed)
	}
}

// wantsFunnel reports whether an Ingress asks to be served to the internet.
func wantsFunnel(ing *networkingv1.Ingress) bool {
	on, err := strconv.ParseBool(ing.Annotations[kit.AnnotationFunnel])
	return err == nil && on
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
