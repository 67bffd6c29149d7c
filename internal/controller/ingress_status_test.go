package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
)

func TestIngressStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	valid := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "01", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	byoValid := contract.CertificateStatus{Source: contract.CertSourceSecret, Serial: "02", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	proxy := func(funnel bool) *standaloneProxy {
		return &standaloneProxy{config: contract.ProxyConfig{Serve: &contract.WebService{HTTP: contract.HTTPOff, Funnel: funnel,
			TLS: contract.WebTLS{Certificates: []contract.CertificateRef{{SecretName: "c", Hosts: []string{"app.example.com", "*.example.com"}}}}}}}
	}
	serving := &contract.ProxyState{FQDN: "shop.tailnet.test", HTTPSEndpoint: "shop.tailnet.test",
		Certificates: map[string]contract.CertificateStatus{"shop.tailnet.test": valid, "app.example.com": byoValid}}
	refused := *serving
	refused.Funnel = map[string]contract.FunnelStatus{"shop.tailnet.test": {Reason: contract.FunnelNotPermitted, Message: "no attr"}}
	public := *serving
	public.Funnel = map[string]contract.FunnelStatus{"shop.tailnet.test": {Public: true}}
	cert := tailnetCert{fqdn: "shop.tailnet.test", cur: valid}
	held := tailnetCert{fqdn: "shop.tailnet.test", hold: &contract.IssuanceHold{Reason: ReasonCertificateRateLimited}}

	for name, c := range map[string]struct {
		scope   ingressScope
		want    []string
		decided bool
	}{
		"not applied":       {ingressScope{state: serving, cert: cert}, nil, false},
		"proxy not joined":  {ingressScope{proxy: proxy(false), cert: cert}, nil, true},
		"serving":           {ingressScope{proxy: proxy(false), state: serving, cert: cert}, []string{"shop.tailnet.test:443", "app.example.com:443"}, true},
		"held, not serving": {ingressScope{proxy: proxy(false), cert: held}, []string{"shop.tailnet.test:443!" + ReasonCertificateRateLimited}, true},
		"funnel refused":    {ingressScope{proxy: proxy(true), state: &refused, cert: cert}, []string{"shop.tailnet.test:443!" + ReasonFunnelNotPermitted, "app.example.com:443"}, true},
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
	s := haIngressScope{svcName: "svc:shop", cert: tailnetCert{fqdn: "shop.tailnet.test", cur: valid}, states: states}
	if _, decided := s.loadBalancer(now); decided {
		t.Errorf("status decided before the group was configured")
	}
	s.configured = &contract.WebService{HTTP: contract.HTTPOff, Funnel: true}
	lb, decided := s.loadBalancer(now)
	if got, want := showIngressLB(lb), []string{"shop.tailnet.test:443!" + ReasonFunnelFailed}; !decided || !slices.Equal(got, want) {
		t.Errorf("load balancer %v decided %v, want %v", got, decided, want)
	}
}

func TestDecideHAIngress(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shop"}}
	missing := blockf(ReasonProxyGroupNotFound, "ProxyGroup %q does not exist", "pg")
	for name, c := range map[string]struct {
		scope   haIngressScope
		reasons []string
	}{
		"group missing":  {haIngressScope{ing: ing, hostname: "shop", groupFinding: &missing}, []string{ReasonProxyGroupNotFound, ReasonNoValidBackends}},
		"hostname taken": {haIngressScope{ing: ing, hostname: "shop", takenBy: "other/shop"}, []string{ReasonDuplicateHostname, ReasonNoValidBackends}},
	} {
		t.Run(name, func(t *testing.T) {
			d := decideHAIngress(&c.scope, []string{"tag:k8s"})
			var reasons []string
			for _, f := range d.findings {
				reasons = append(reasons, f.reason)
				if !f.blocking {
					t.Errorf("%s does not block", f.reason)
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
	settings := Settings{DefaultTags: []string{"tag:k8s"}, ACMEDirectoryURL: "https://acme.test/dir", ControlURL: "https://control.test"}

	p, findings := decideStandaloneIngress(&ingressScope{ing: ing}, settings)
	if got := p.config.TLS.ACMEDirectoryURL; got != settings.ACMEDirectoryURL || p.config.ControlURL != settings.ControlURL || !slices.Equal(p.config.Tags, settings.DefaultTags) {
		t.Errorf("config %+v from settings %+v", p.config, settings)
	}
	if !hasBlocking(findings) {
		t.Errorf("an Ingress without backends is served: %+v", findings)
	}
	p, findings = decideStandaloneIngress(&ingressScope{ing: ing, class: staging}, settings)
	if p.config.TLS.ACMEDirectoryURL != LetsEncryptStaging || p.class != staging {
		t.Errorf("a staging class gives directory %q", p.config.TLS.ACMEDirectoryURL)
	}
	var ignored *finding
	for i := range findings {
		if findings[i].reason == ReasonProxyClassFieldIgnored {
			ignored = &findings[i]
		}
	}
	if ignored == nil || ignored.blocking {
		t.Errorf("findings %+v, want a non-blocking %s", findings, ReasonProxyClassFieldIgnored)
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
	cert := tailnetCert{fqdn: "shop.tailnet.test", cur: valid}
	held := tailnetCert{fqdn: "shop.tailnet.test", hold: &contract.IssuanceHold{Reason: ReasonCertificateRateLimited}}

	for name, c := range map[string]struct {
		cert   tailnetCert
		states []*contract.ProxyState
		want   []string
		served bool
	}{
		"no replica advertises yet": {cert, notYet, nil, false},
		"advertised":                {cert, advertising, []string{"shop.tailnet.test:443:80", "app.example.com:443"}, true},
		"domain not known yet":      {tailnetCert{}, advertising, []string{"app.example.com:443"}, false},
		"held, no certificate":      {held, notYet, []string{"shop.tailnet.test:443!" + ReasonCertificateRateLimited}, false},
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
