package ingress

import (
	"fmt"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

func TestIngressStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	valid := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "01", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	byoValid := contract.CertificateStatus{Source: contract.CertSourceSecret, Serial: "02", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	proxy := func(funnel bool) *proxies.StandaloneProxy {
		return &proxies.StandaloneProxy{Config: contract.ProxyConfig{Serve: &contract.WebService{HTTP: contract.HTTPOff, Funnel: funnel,
			TLS: contract.WebTLS{Certificates: []contract.CertificateRef{{SecretName: "c", Hosts: []string{"app.example.com", "*.example.com"}}}}}}}
	}
	serving := &contract.ProxyState{FQDN: "shop.tailnet.test", HTTPSEndpoint: "shop.tailnet.test",
		Certificates: map[string]contract.CertificateStatus{"shop.tailnet.test": valid, "app.example.com": byoValid}}
	refused := *serving
	refused.Funnel = map[string]contract.FunnelStatus{"shop.tailnet.test": {Reason: contract.FunnelNotPermitted, Message: "no attr"}}
	public := *serving
	public.Funnel = map[string]contract.FunnelStatus{"shop.tailnet.test": {Public: true}}
	cert := certs.TailnetCert{FQDN: "shop.tailnet.test", Cur: valid}
	held := certs.TailnetCert{FQDN: "shop.tailnet.test", Hold: &contract.IssuanceHold{Reason: kit.ReasonCertificateRateLimited}}

	for name, c := range map[string]struct {
		scope   ingressScope
		want    []string
		decided bool
	}{
		"not applied":       {ingressScope{state: serving, cert: cert}, nil, false},
		"proxy not joined":  {ingressScope{proxy: proxy(false), cert: cert}, nil, true},
		"serving":           {ingressScope{proxy: proxy(false), state: serving, cert: cert}, []string{"shop.tailnet.test:443", "app.example.com:443"}, true},
		"held, not serving": {ingressScope{proxy: proxy(false), cert: held}, []string{"shop.tailnet.test:443!" + kit.ReasonCertificateRateLimited}, true},
		"funnel refused":    {ingressScope{proxy: proxy(true), state: &refused, cert: cert}, []string{"shop.tailnet.test:443!" + kit.ReasonFunnelNotPermitted, "app.example.com:443"}, true},
		"funnel public":     {ingressScope{proxy: proxy(true), state: &public, cert: cert}, []string{"shop.tailnet.test:443", "app.example.com:443"}, true},
	} {
		t.Run(name, func(t *testing.T) {
			lb, decided := c.scope.loadBalancer(now)
			if got := showIngressLB(lb); !slices.Equal(got, c.want) || decided != c.decided {
				t.Errorf("load balancer %v decided %v, want %v decided %v", got, decided, c.want, c.decided)
			}
		})
	}
}

func TestHAIngressStatusFunnel(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	valid := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "01", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	states := []*contract.ProxyState{{Advertised: []string{"svc:shop"}, Funnel: map[string]contract.FunnelStatus{"shop.tailnet.test": {Reason: "ListenFailed", Message: "port taken"}}}}
	s := HAIngressScope{svcName: "svc:shop", cert: certs.TailnetCert{FQDN: "shop.tailnet.test", Cur: valid}, States: states}
	if _, decided := s.loadBalancer(now); decided {
		t.Errorf("status decided before the group was configured")
	}
	s.configured = &contract.WebService{HTTP: contract.HTTPOff, Funnel: true}
	lb, decided := s.loadBalancer(now)
	if got, want := showIngressLB(lb), []string{"shop.tailnet.test:443!" + kit.ReasonFunnelFailed}; !decided || !slices.Equal(got, want) {
		t.Errorf("load balancer %v decided %v, want %v", got, decided, want)
	}
}

func TestDecideHAIngress(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shop"}}
	missing := kit.Blockf(kit.ReasonProxyGroupNotFound, "ProxyGroup %q does not exist", "pg")
	for name, c := range map[string]struct {
		scope   HAIngressScope
		reasons []string
	}{
		"group missing":  {HAIngressScope{Ing: ing, Hostname: "shop", groupFinding: &missing}, []string{kit.ReasonProxyGroupNotFound, kit.ReasonNoValidBackends}},
		"hostname taken": {HAIngressScope{Ing: ing, Hostname: "shop", takenBy: "other/shop"}, []string{kit.ReasonDuplicateHostname, kit.ReasonNoValidBackends}},
	} {
		t.Run(name, func(t *testing.T) {
			d := decideHAIngress(&c.scope, []string{"tag:k8s"})
			var reasons []string
			for _, f := range d.Findings {
				reasons = append(reasons, f.Reason)
				if !f.Blocking {
					t.Errorf("%s does not block", f.Reason)
				}
			}
			if !slices.Equal(reasons, c.reasons) {
				t.Errorf("findings %v, want %v", reasons, c.reasons)
			}
		})
	}
}

func TestDecideStandaloneIngress(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shop"}}
	staging := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "staging"}, Spec: tsv1alpha1.ProxyClassSpec{
		UseLetsEncryptStagingEnvironment: true,
		StatefulSet:                      &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{}}}}}
	settings := kit.Settings{DefaultTags: []string{"tag:k8s"}, ACMEDirectoryURL: "https://acme.test/dir", ControlURL: "https://control.test"}

	p, findings := decideStandaloneIngress(&ingressScope{ing: ing}, settings)
	if got := p.Config.TLS.ACMEDirectoryURL; got != settings.ACMEDirectoryURL || p.Config.ControlURL != settings.ControlURL || !slices.Equal(p.Config.Tags, settings.DefaultTags) {
		t.Errorf("config %+v from settings %+v", p.Config, settings)
	}
	if !kit.HasBlocking(findings) {
		t.Errorf("an Ingress without backends is served: %+v", findings)
	}
	p, findings = decideStandaloneIngress(&ingressScope{ing: ing, class: staging}, settings)
	if p.Config.TLS.ACMEDirectoryURL != proxies.LetsEncryptStaging || p.Class != staging {
		t.Errorf("a staging class gives directory %q", p.Config.TLS.ACMEDirectoryURL)
	}
	var ignored *kit.Finding
	for i := range findings {
		if findings[i].Reason == kit.ReasonProxyClassFieldIgnored {
			ignored = &findings[i]
		}
	}
	if ignored == nil || ignored.Blocking {
		t.Errorf("findings %+v, want a non-blocking %s", findings, kit.ReasonProxyClassFieldIgnored)
	}
}

func TestHAIngressLoadBalancer(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	valid := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "01", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	ws := &contract.WebService{HTTP: contract.HTTPRedirect,
		TLS: contract.WebTLS{Certificates: []contract.CertificateRef{{SecretName: "c", Hosts: []string{"app.example.com"}}}}}
	advertising := []*contract.ProxyState{nil, {Advertised: []string{"svc:shop"}, Certificates: map[string]contract.CertificateStatus{
		"shop.tailnet.test": valid, "app.example.com": {Source: contract.CertSourceSecret, Serial: "02", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}}}}
	notYet := []*contract.ProxyState{{Advertised: nil}}
	cert := certs.TailnetCert{FQDN: "shop.tailnet.test", Cur: valid}
	held := certs.TailnetCert{FQDN: "shop.tailnet.test", Hold: &contract.IssuanceHold{Reason: kit.ReasonCertificateRateLimited}}

	for name, c := range map[string]struct {
		cert   certs.TailnetCert
		states []*contract.ProxyState
		want   []string
		served bool
	}{
		"no replica advertises yet": {cert, notYet, nil, false},
		"advertised":                {cert, advertising, []string{"shop.tailnet.test:443:80", "app.example.com:443"}, true},
		"domain not known yet":      {certs.TailnetCert{}, advertising, []string{"app.example.com:443"}, false},
		"held, no certificate":      {held, notYet, []string{"shop.tailnet.test:443!" + kit.ReasonCertificateRateLimited}, false},
	} {
		t.Run(name, func(t *testing.T) {
			lb, served := haIngressLoadBalancer("svc:shop", ws, c.cert, c.states, now)
			if got := showIngressLB(lb); !slices.Equal(got, c.want) || served != c.served {
				t.Errorf("load balancer %v served %v, want %v served %v", got, served, c.want, c.served)
			}
		})
	}
}

// showIngressLB writes load-balancer entries as host:port[!error]... for comparisons.
func showIngressLB(lb []networkingv1.IngressLoadBalancerIngress) []string {
	var out []string
	for _, e := range lb {
		s := e.Hostname
		for _, p := range e.Ports {
			s += fmt.Sprintf(":%d", p.Port)
			if p.Error != nil {
				s += "!" + *p.Error
			}
		}
		out = append(out, s)
	}
	return out
}
