package service

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// What both Service reconcilers use: which Services are exposed, and how a finding reads.

// exposed reports whether s asks to be exposed on the tailnet: annotated tailscale.com/expose,
// or a LoadBalancer of the tailscale class (or of no class, where the operator is the default).
func exposed(s *corev1.Service, settings kit.Settings) bool {
	if s.Annotations[kit.AnnotationExpose] == "true" {
		return true
	}
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if s.Spec.LoadBalancerClass == nil {
		return settings.DefaultLoadBalancer
	}
	return *s.Spec.LoadBalancerClass == kit.LoadBalancerClass
}

// ServiceAnnotations are the tailscale.com/ annotations honoured on a Service.
var ServiceAnnotations = []string{kit.AnnotationExpose, kit.AnnotationHostname, kit.LabelProxyClass, kit.AnnotationProxyGroup, kit.AnnotationTags,
	kit.AnnotationProxyProtocol}

// ServiceProxyConfig is the proxy config a Service asks for, or nil with the reasons it cannot
// be served.
func ServiceProxyConfig(svc *corev1.Service, s kit.Settings) (*contract.ProxyConfig, []kit.Finding) {
	var findings []kit.Finding
	hostname := svc.Annotations[kit.AnnotationHostname]
	if hostname == "" {
		hostname = kit.TruncateLabel(kit.DNSLabelish(svc.Namespace + "-" + svc.Name))
	} else if !contract.ValidHostname(hostname) {
		findings = append(findings, kit.Blockf(kit.ReasonInvalidAnnotation,
			"annotation %s=%q must be a DNS label: lower-case letters, digits and dashes, at most 63", kit.AnnotationHostname, hostname))
	}
	if v, ok := svc.Annotations[kit.AnnotationExpose]; ok && v != "true" {
		if b, err := strconv.ParseBool(v); err != nil || b {
			findings = append(findings, kit.Blockf(kit.ReasonInvalidAnnotation, "annotation %s=%q: only \"true\" exposes a Service", kit.AnnotationExpose, v))
		}
	}
	tags, f := proxies.ParseTags(svc, s.DefaultTags)
	if f != nil {
		findings = append(findings, *f)
	}
	var dest contract.Destination
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		dest.DNSName = svc.Spec.ExternalName
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		findings = append(findings, kit.Blockf(kit.ReasonInvalidService, "headless Services (clusterIP: None) have no address to forward to; expose a ClusterIP Service"))
	case svc.Spec.ClusterIP == "":
		findings = append(findings, kit.Blockf(kit.ReasonInvalidService, "the Service has no ClusterIP yet"))
	default:
		dest.IPs = svc.Spec.ClusterIPs
		if len(dest.IPs) == 0 {
			dest.IPs = []string{svc.Spec.ClusterIP}
		}
	}
	if f := proxyProtocol(svc, &dest); f != nil {
		findings = append(findings, *f)
	}
	if len(findings) > 0 {
		return nil, findings
	}
	// Told, and no reason not to serve the rest.
	if f := kit.UnsupportedAnnotations("Service", svc.Annotations, ServiceAnnotations...); f != nil {
		findings = append(findings, *f)
	}
	return &contract.ProxyConfig{
		Kind:       contract.KindService,
		Hostname:   hostname,
		Tags:       tags,
		ControlURL: s.ControlURL,
		Firewall:   contract.FirewallConfig{Mode: s.FirewallMode},
		Forward:    &dest,
	}, findings
}

// proxyProtocol sets dest's PROXY protocol relay from the Service's annotation: every port of
// the Service, each relayed to the same port of the destination.
func proxyProtocol(svc *corev1.Service, dest *contract.Destination) *kit.Finding {
	v, ok := svc.Annotations[kit.AnnotationProxyProtocol]
	if !ok {
		return nil
	}
	switch v {
	case "v1", "1":
		dest.ProxyProtocol = 1
	case "v2", "2":
		dest.ProxyProtocol = 2
	default:
		f := kit.Blockf(kit.ReasonInvalidAnnotation, "annotation %s=%q must be v1 or v2", kit.AnnotationProxyProtocol, v)
		return &f
	}
	if len(svc.Spec.Ports) == 0 {
		f := kit.Blockf(kit.ReasonInvalidAnnotation, "annotation %s: the Service lists no ports to relay", kit.AnnotationProxyProtocol)
		return &f
	}
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		switch {
		case proto == corev1.ProtocolUDP && dest.ProxyProtocol == 1:
			f := kit.Blockf(kit.ReasonInvalidAnnotation, "annotation %s=%q: port %d is UDP, and PROXY protocol v1 has no UDP form: use v2",
				kit.AnnotationProxyProtocol, v, p.Port)
			return &f
		case proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP:
			f := kit.Blockf(kit.ReasonInvalidAnnotation, "annotation %s: port %d is %s; the PROXY protocol carries TCP and UDP only",
				kit.AnnotationProxyProtocol, p.Port, proto)
			return &f
		}
		dest.Ports = append(dest.Ports, contract.Port{Port: uint16(p.Port), Protocol: string(proto)}) //nolint:gosec // a Service port is 1 to 65535
	}
	return nil
}

func findingMessages(fs []kit.Finding) string {
	var msgs []string
	for _, f := range fs {
		msgs = append(msgs, f.Message)
	}
	return strings.Join(msgs, "; ")
}
