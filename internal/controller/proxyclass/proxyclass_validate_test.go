package proxyclass

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

func TestValidateProxyClass(t *testing.T) {
	pod := func(p tsv1alpha1.Pod) tsv1alpha1.ProxyClassSpec {
		return tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &p}}
	}
	sm := tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true}}}
	cases := []struct {
		name        string
		spec        tsv1alpha1.ProxyClassSpec
		crd         bool
		wantProblem string
		wantWarning string
		wantIgnored string
		wantRecheck bool
	}{
		{name: "empty is valid", spec: tsv1alpha1.ProxyClassSpec{}},
		{name: "good labels", spec: pod(tsv1alpha1.Pod{Labels: map[string]string{"app.kubernetes.io/name": "x"}})},
		{name: "bad label value", spec: pod(tsv1alpha1.Pod{Labels: map[string]string{"a": "not valid!"}}), wantProblem: "statefulSet.pod.labels: value"},
		{name: "bad sts annotation", spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Annotations: map[string]string{"a/b/c": "x"}}}, wantProblem: "statefulSet.annotations"},
		{name: "bad node selector", spec: pod(tsv1alpha1.Pod{NodeSelector: map[string]string{"-x": "y"}}), wantProblem: "nodeSelector"},
		{name: "image with space", spec: pod(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Image: "proxy :v1"}}), wantProblem: "white space"},
		{name: "the original's proxy image", spec: pod(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Image: "tailscale/tailscale:v1.90.0"}}),
			wantProblem: "tailscaleContainer.image \"tailscale/tailscale:v1.90.0\" is the Tailscale operator's proxy"},
		{name: "the original's proxy image from GHCR, by digest", spec: pod(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{
			Image: "ghcr.io/tailscale/tailscale@sha256:0123"}}), wantProblem: "tailscaleInitContainer.image"},
		{name: "a mirror of the original's proxy image", spec: pod(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{
			Image: "registry.example:5000/tailscale/tailscale"}}), wantProblem: "containerboot"},
		{name: "a mirror of ours", spec: pod(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Image: "registry.example:5000/tsingress/proxy:v1"}})},
		{name: "an image named like the original's but not it", spec: pod(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Image: "example/mytailscale/tailscale:v1"}})},
		{name: "static endpoints, not served", spec: tsv1alpha1.ProxyClassSpec{StaticEndpoints: &tsv1alpha1.StaticEndpointsConfig{
			NodePort: &tsv1alpha1.NodePortConfig{Ports: []tsv1alpha1.PortRange{{Port: 30000, EndPort: 30010}}}}}, wantIgnored: "staticEndpoints is not served"},
		{name: "init debug", spec: pod(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{Debug: &tsv1alpha1.Debug{Enable: true}}}), wantProblem: "tailscaleInitContainer.debug"},
		{name: "init container with sysctl forwarding", spec: pod(tsv1alpha1.Pod{
			SecurityContext:        &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}}},
			TailscaleInitContainer: &tsv1alpha1.Container{Image: "proxy:v1"}}), wantProblem: "tailscaleInitContainer cannot apply"},
		{name: "init container without sysctl forwarding", spec: pod(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{Image: "proxy:v1"}})},
		{name: "TS env override", spec: pod(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Env: []tsv1alpha1.Env{{Name: "TS_X"}}}}), wantWarning: "TS_X"},
		{name: "service monitor without CRD", spec: sm, wantProblem: "ServiceMonitor CRD", wantRecheck: true},
		{name: "service monitor with CRD", spec: sm, crd: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := validateProxyClass(&tc.spec, tc.crd)
			check := func(kind string, got []string, want string) {
				joined := strings.Join(got, "\n")
				if want == "" && len(got) > 0 || want != "" && !strings.Contains(joined, want) {
					t.Errorf("%s = %q, want %q", kind, joined, want)
				}
			}
			check("problems", v.problems, tc.wantProblem)
			check("warnings", v.warnings, tc.wantWarning)
			check("ignored", v.ignored, tc.wantIgnored)
			if v.missingCRD != tc.wantRecheck {
				t.Errorf("missingCRD = %v", v.missingCRD)
			}
		})
	}
}
