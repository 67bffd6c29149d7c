package controller

import (
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/ingress"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/service"
	"github.com/tsingress/tsingress/internal/testing/docstest"
)

// The route builder and the annotation parsers turn what users write into the proxy config
// document. Whatever the API server accepts, they must either produce a document the proxy
// accepts (contract validation) or block with a stable reason; they must never panic.
// `go test` runs the seeds and testdata/fuzz; `make fuzz` explores further.

// ingressInput is one fuzzed Ingress with one backend Service.
type ingressInput struct {
	namespace, name          string
	tlsHost, byoHost         string
	ruleHost, path           string
	pathType                 uint8
	svcName, portName        string
	portNumber               int32
	clusterIP, externalName  string
	protocol, redirect, tags string
	endpoint                 string
}

func FuzzIngressRoutes(f *testing.F) {
	for _, in := range []ingressInput{
		{"default", "web", "web", "", "", "/", 1, "echo", "http", 80, "10.96.0.10", "", "", "true", "", "10.244.0.5"},
		{"prod", "app", "app.example.ts.net", "app.example.com", "app.example.com", "/api", 0, "api", "", 443, "fd00::10", "", "https", "false", "tag:web,tag:k8s", "fd00:10:244::5"},
		{"ns", "wild", "w", "*.example.com", "*.example.com", "/a/b", 2, "ext", "https", 8443, "", "db.example.com", "https-insecure", "yes", " , ", ""},
		{"ns", "x", "-bad", "", "w", "relative", 1, "missing", "http", 80, "None", "", "gopher", "1", "tag:", ""},
		{"a", strings.Repeat("n", 70), "", "", "", "", 0, "echo", "", 80, "10.0.0.1", "", "", "", "tag:a", ""},
	} {
		f.Add(in.namespace, in.name, in.tlsHost, in.byoHost, in.ruleHost, in.path, in.pathType, in.svcName, in.portName, in.portNumber,
			in.clusterIP, in.externalName, in.protocol, in.redirect, in.tags, in.endpoint)
	}
	f.Fuzz(func(t *testing.T, namespace, name, tlsHost, byoHost, ruleHost, path string, pathType uint8, svcName, portName string,
		portNumber int32, clusterIP, externalName, protocol, redirect, tags, endpoint string) {
		in := ingressInput{namespace, name, tlsHost, byoHost, ruleHost, path, pathType, svcName, portName, portNumber,
			clusterIP, externalName, protocol, redirect, tags, endpoint}
		ing, inputs, ok := in.objects()
		if !ok {
			return // not something the API server would store
		}
		// The bring-your-own Secret resolves: its hosts are served with a copy of it.
		var byo certs.BYOCertificates
		for _, t := range ing.Spec.TLS {
			if kit.IsBYO(t) {
				var hosts []string
				for _, h := range t.Hosts {
					if kit.CustomHost(h) {
						hosts = append(hosts, strings.ToLower(h))
					}
				}
				byo.Refs = append(byo.Refs, contract.CertificateRef{SecretName: "ts-copy", Hosts: hosts})
			}
		}
		d := ingress.DecideIngress(ing, inputs, byo, []string{"tag:k8s"})
		checkFindings(t, d.Findings)
		if kit.HasBlocking(d.Findings) {
			return
		}
		cfg := contract.ProxyConfig{Kind: contract.KindIngress, Hostname: d.Hostname, Tags: d.Tags, StateSecret: "ts-x-0", Serve: &d.WS}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("the route builder made a config the proxy refuses: %v\nIngress %+v\nservices %+v\nroutes %+v", err, ing.Spec, inputs.Services, d.WS.Routes)
		}
		if _, err := contract.ProxyConfigs.Encode(&cfg); err != nil {
			t.Fatalf("encoding: %v", err)
		}
		// On a ProxyGroup the same routes go into the group's Serve config.
		serve := contract.ServeConfig{Services: map[string]contract.WebService{"svc:" + d.Hostname: d.WS}}
		if err := serve.Validate(); err != nil {
			t.Fatalf("the group's Serve config would be refused: %v", err)
		}
	})
}

// objects builds the Ingress and its route inputs; ok is false for what the API server rejects.
func (in ingressInput) objects() (*networkingv1.Ingress, ingress.RouteInputs, bool) {
	if !apiName(in.namespace, true) || !apiName(in.name, false) || !apiName(in.svcName, true) || !apiHost(in.tlsHost, true) ||
		!apiHost(in.byoHost, true) || !apiHost(in.ruleHost, true) || (in.portName == "" && (in.portNumber < 1 || in.portNumber > 65535)) ||
		(in.portName != "" && len(validation.IsValidPortName(in.portName)) > 0) {
		return nil, ingress.RouteInputs{}, false
	}
	backend := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: in.svcName,
		Port: networkingv1.ServiceBackendPort{Name: in.portName}}}
	if in.portName == "" {
		backend.Service.Port.Number = in.portNumber
	}
	pathType := []networkingv1.PathType{networkingv1.PathTypePrefix, networkingv1.PathTypeExact, networkingv1.PathTypeImplementationSpecific}[in.pathType%3]
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: in.namespace, Name: in.name, Annotations: map[string]string{}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			Rules: []networkingv1.IngressRule{{Host: in.ruleHost, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{Path: in.path, PathType: &pathType, Backend: backend}},
			}}}},
			DefaultBackend: &backend,
		},
	}
	if in.tlsHost != "" {
		ing.Spec.TLS = append(ing.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{in.tlsHost}})
	}
	if in.byoHost != "" {
		ing.Spec.TLS = append(ing.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{in.byoHost}, SecretName: "byo"})
	}
	for k, v := range map[string]string{kit.AnnotationBackendProtocol: in.protocol, kit.AnnotationHTTPRedirect: in.redirect, kit.AnnotationTags: in.tags} {
		if v != "" {
			ing.Annotations[k] = v
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: in.namespace, Name: in.svcName},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: in.portName, Port: max(1, in.portNumber%65536)}}}}
	switch {
	case in.externalName != "":
		if len(validation.IsDNS1123Subdomain(strings.TrimSuffix(in.externalName, "."))) > 0 {
			return nil, ingress.RouteInputs{}, false
		}
		svc.Spec.Type, svc.Spec.ExternalName = corev1.ServiceTypeExternalName, in.externalName
	case in.clusterIP == "None", in.clusterIP == "":
		svc.Spec.ClusterIP = in.clusterIP
	default:
		if len(validation.IsValidIP(nil, in.clusterIP)) > 0 {
			return nil, ingress.RouteInputs{}, false
		}
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = in.clusterIP, []string{in.clusterIP}
	}
	inputs := ingress.RouteInputs{Services: map[string]*corev1.Service{in.svcName: svc}, Domain: "tailnet.test"}
	if in.endpoint != "" {
		family := discoveryv1.AddressTypeIPv4
		if strings.Contains(in.endpoint, ":") {
			family = discoveryv1.AddressTypeIPv6
		}
		inputs.Slices = map[string][]discoveryv1.EndpointSlice{in.svcName: {{
			AddressType: family,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{in.endpoint}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(in.portName), Port: ptr.To[int32](8080)}},
		}}}
	}
	return ing, inputs, true
}

func FuzzServiceAnnotations(f *testing.F) {
	f.Add("default", "db", "db", "true", "tag:k8s", "10.96.0.10", "fd00::10", "")
	f.Add("default", "db", "", "", "", "None", "", "")
	f.Add("default", "ext", "Bad_Name", "false", "tag:a, tag:b,", "", "", "db.example.com.")
	f.Add("ns", strings.Repeat("a", 63), strings.Repeat("h", 64), "1", "tag:-x", "", "", "")
	f.Fuzz(func(t *testing.T, namespace, name, hostname, expose, tags, ip, ip6, externalName string) {
		if !apiName(namespace, true) || !apiName(name, true) {
			return
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: map[string]string{}}}
		for k, v := range map[string]string{kit.AnnotationHostname: hostname, kit.AnnotationExpose: expose, kit.AnnotationTags: tags} {
			if v != "" {
				svc.Annotations[k] = v
			}
		}
		switch {
		case externalName != "":
			if len(validation.IsDNS1123Subdomain(strings.TrimSuffix(externalName, "."))) > 0 {
				return
			}
			svc.Spec.Type, svc.Spec.ExternalName = corev1.ServiceTypeExternalName, externalName
		case ip == "None" || ip == "":
			svc.Spec.ClusterIP = ip
		default:
			for _, a := range []string{ip, ip6} {
				if a != "" && len(validation.IsValidIP(nil, a)) > 0 {
					return
				}
			}
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip, []string{ip}
			if ip6 != "" {
				svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, ip6)
			}
		}
		cfg, findings := service.ServiceProxyConfig(svc, kit.Settings{DefaultTags: []string{"tag:k8s"}, FirewallMode: contract.FirewallAuto})
		checkFindings(t, findings)
		if cfg == nil {
			if !kit.HasBlocking(findings) {
				t.Fatalf("no config and no blocking finding for %+v", svc)
			}
			return
		}
		cfg.StateSecret = "ts-x-0"
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a Service made a config the proxy refuses: %v\n%+v", err, svc)
		}
		// The same Service on a ProxyGroup: its Tailscale Service name and DNAT document.
		svcName := "svc:" + kit.HAServiceHostname(svc)
		dnat := contract.DNATConfig{Services: map[string]contract.DNATService{svcName: {VIPs: []string{"100.100.0.1"}, Destination: *cfg.Forward}}}
		if err := dnat.Validate(); err != nil {
			t.Fatalf("the group's DNAT config would be refused: %v\n%+v", err, svc)
		}
	})
}

// checkFindings fails on a finding whose reason is not one of the documented reasons.
func checkFindings(t *testing.T, fs []kit.Finding) {
	t.Helper()
	for _, f := range fs {
		if !documentedReason(f.Reason) {
			t.Fatalf("finding with undocumented reason %q: %s", f.Reason, f.Message)
		}
		if f.Blocking && !f.Warning {
			t.Fatalf("blocking finding %s is no warning", f.Reason)
		}
	}
}

var documented = sync.OnceValues(docstest.Reasons)

func documentedReason(reason string) bool {
	reasons, err := documented()
	return err == nil && slices.Contains(reasons, reason)
}

// apiName: what the API server takes as a namespace (DNS label) or object name (subdomain).
func apiName(s string, label bool) bool {
	if label {
		return len(validation.IsDNS1123Label(s)) == 0
	}
	return len(validation.IsDNS1123Subdomain(s)) == 0
}

// apiHost: what the API server takes as an Ingress host.
func apiHost(s string, optional bool) bool {
	switch {
	case s == "":
		return optional
	case strings.Contains(s, "*"):
		return len(validation.IsWildcardDNS1123Subdomain(s)) == 0
	}
	return len(validation.IsDNS1123Subdomain(s)) == 0
}
