package service

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

func TestServiceProxyConfigProxyProtocol(t *testing.T) {
	port := func(p int32, proto corev1.Protocol) corev1.ServicePort {
		return corev1.ServicePort{Port: p, Protocol: proto}
	}
	for name, tc := range map[string]struct {
		value       string
		ports       []corev1.ServicePort
		wantVersion int
		wantPorts   []contract.Port
		wantErr     string
	}{
		"v1": {"v1", []corev1.ServicePort{port(5432, corev1.ProtocolTCP)}, 1, []contract.Port{{Port: 5432, Protocol: "TCP"}}, ""},
		"2, TCP and UDP, protocol defaulted": {"2", []corev1.ServicePort{port(53, ""), port(53, corev1.ProtocolUDP)}, 2,
			[]contract.Port{{Port: 53, Protocol: "TCP"}, {Port: 53, Protocol: "UDP"}}, ""},
		"unknown version": {"v3", []corev1.ServicePort{port(80, corev1.ProtocolTCP)}, 0, nil, "must be v1 or v2"},
		"v1 with UDP":     {"v1", []corev1.ServicePort{port(53, corev1.ProtocolUDP)}, 0, nil, "v1 has no UDP form"},
		"SCTP":            {"v2", []corev1.ServicePort{port(9, corev1.ProtocolSCTP)}, 0, nil, "TCP and UDP only"},
		"no ports":        {"v2", nil, 0, nil, "no ports"},
	} {
		t.Run(name, func(t *testing.T) {
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default", Annotations: map[string]string{
					kit.AnnotationExpose: "true", kit.AnnotationProxyProtocol: tc.value}},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.5", ClusterIPs: []string{"10.96.0.5"}, Ports: tc.ports},
			}
			cfg, findings := ServiceProxyConfig(svc, kit.Settings{DefaultTags: []string{"tag:k8s"}})
			if tc.wantErr != "" {
				if cfg != nil || len(findings) != 1 || findings[0].Reason != kit.ReasonInvalidAnnotation || !strings.Contains(findings[0].Message, tc.wantErr) {
					t.Fatalf("config %v, findings %+v; want none, and %s saying %q", cfg, findings, kit.ReasonInvalidAnnotation, tc.wantErr)
				}
				return
			}
			if cfg == nil || len(findings) > 0 {
				t.Fatalf("config %v, findings %+v; want a config and no finding", cfg, findings)
			}
			if cfg.Forward.ProxyProtocol != tc.wantVersion || !slices.Equal(cfg.Forward.Ports, tc.wantPorts) {
				t.Errorf("forward %+v, want version %d ports %v", cfg.Forward, tc.wantVersion, tc.wantPorts)
			}
			if err := cfg.Forward.Validate(); err != nil {
				t.Errorf("the proxy would refuse the destination: %v", err)
			}
		})
	}
}
