package kit

import (
	"strconv"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
)

// ParseFunnel reads the Funnel annotation of an object of kind in namespace: on when it asks
// for Funnel and the operator lets the namespace use it (allowed); a finding says why not
// when it asks and cannot have it.
func ParseFunnel(annotations map[string]string, kind, namespace string, allowed bool) (on bool, f *Finding) {
	v, ok := annotations[AnnotationFunnel]
	if !ok {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	switch {
	case err != nil:
		f := Warnf(ReasonInvalidAnnotation, "annotation %s=%q is not a boolean; not served over Funnel", AnnotationFunnel, v)
		return false, &f
	case on && !allowed:
		f := Warnf(ReasonFunnelNamespaceNotPermitted,
			"annotation %s: the operator does not let %ss of namespace %s be served to the internet (its --funnel-namespaces, "+
				"OPERATOR_FUNNEL_NAMESPACES, does not list it); served on the tailnet only", AnnotationFunnel, kind, namespace)
		return false, &f
	}
	return on, nil
}

// FunnelOutcome judges what the proxies serving fqdn report about Funnel: public while one of
// them takes Funnel connections for it, else the first problem one reports (none yet: zero).
func FunnelOutcome(fqdn string, states []*contract.ProxyState) (public bool, problem contract.FunnelStatus) {
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

// FunnelProblem is the stable reason and message of a proxy's report that fqdn is not served
// to the internet, its proxies tagged tags; "" while it is, or nothing is reported yet.
func FunnelProblem(fqdn string, tags []string, problem contract.FunnelStatus) (reason, msg string) {
	switch problem.Reason {
	case "":
		return "", ""
	case contract.FunnelNotPermitted:
		quoted := make([]string, len(tags))
		for i, t := range tags {
			quoted[i] = strconv.Quote(t)
		}
		return ReasonFunnelNotPermitted, "https://" + fqdn + " is not served to the internet: the tailnet does not let the proxies (tags " +
			strings.Join(tags, ",") + `) use Funnel; its policy needs {"target": [` + strings.Join(quoted, ", ") +
			`], "attr": ["funnel"]} in nodeAttrs, and HTTPS on (the proxy says: ` + problem.Message + ")"
	}
	return ReasonFunnelFailed, "https://" + fqdn + " is not served to the internet: " + problem.Message
}

// ReportFunnel reports, for an object that asks for Funnel, whether its tailnet name fqdn is
// served to the internet: a step of progress once it is, a Warning while the proxies (tagged
// tags) say why not.
func ReportFunnel(r Reporter, obj client.Object, fqdn string, tags []string, states []*contract.ProxyState) {
	public, problem := FunnelOutcome(fqdn, states)
	if public {
		r.Progress(obj, "funnel", ReasonFunnelEnabled, "serving https://%s to the internet through Funnel", fqdn)
		return
	}
	if reason, msg := FunnelProblem(fqdn, tags, problem); reason != "" {
		r.Warning(obj, reason, "%s", msg)
	}
}
