package proxyclass

import (
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/docstest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// proxyClassFieldCases set one ProxyClass field each and check its effect on an L3 proxy (which
// has the forwarding init container) and its config. docs/proxyclass.md names each case.
var proxyClassFieldCases = []struct {
	field string
	spec  tsv1alpha1.ProxyClassSpec
	check func(t *testing.T, sts *appsv1.StatefulSet, cfg *contract.ProxyConfig)
}{
	{"spec.statefulSet.labels", tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Labels: map[string]string{"team": "a", kit.LabelManaged: "no"}}},
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Labels["team"] != "a" || sts.Labels[kit.LabelManaged] != "true" {
				t.Errorf("StatefulSet labels %v: want the class's, the operator's winning", sts.Labels)
			}
		}},
	{"spec.statefulSet.annotations", tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Annotations: map[string]string{"note": "x"}}},
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Annotations["note"] != "x" {
				t.Errorf("StatefulSet annotations %v", sts.Annotations)
			}
		}},
	{"spec.statefulSet.pod.labels", podSpec(tsv1alpha1.Pod{Labels: map[string]string{"team": "a", kit.LabelParentName: "other"}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if l := sts.Spec.Template.Labels; l["team"] != "a" || l[kit.LabelParentName] != "p" {
				t.Errorf("Pod labels %v: want the class's, the operator's winning", l)
			}
		}},
	{"spec.statefulSet.pod.annotations", podSpec(tsv1alpha1.Pod{Annotations: map[string]string{"note": "x"}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Spec.Template.Annotations["note"] != "x" {
				t.Errorf("Pod annotations %v", sts.Spec.Template.Annotations)
			}
		}},
	{"spec.statefulSet.pod.affinity", podSpec(tsv1alpha1.Pod{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if a := sts.Spec.Template.Spec.Affinity; a == nil || a.NodeAffinity == nil {
				t.Errorf("affinity %+v", a)
			}
		}},
	{"spec.statefulSet.pod.tolerations", podSpec(tsv1alpha1.Pod{Tolerations: []corev1.Toleration{{Key: "edge", Operator: corev1.TolerationOpExists}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if tl := sts.Spec.Template.Spec.Tolerations; len(tl) != 1 || tl[0].Key != "edge" {
				t.Errorf("tolerations %+v", tl)
			}
		}},
	{"spec.statefulSet.pod.nodeSelector", podSpec(tsv1alpha1.Pod{NodeSelector: map[string]string{"zone": "a"}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Spec.Template.Spec.NodeSelector["zone"] != "a" {
				t.Errorf("node selector %v", sts.Spec.Template.Spec.NodeSelector)
			}
		}},
	{"spec.statefulSet.pod.nodeName", podSpec(tsv1alpha1.Pod{NodeName: "node-1"}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Spec.Template.Spec.NodeName != "node-1" {
				t.Errorf("node name %q", sts.Spec.Template.Spec.NodeName)
			}
		}},
	{"spec.statefulSet.pod.topologySpreadConstraints", podSpec(tsv1alpha1.Pod{TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: corev1.ScheduleAnyway}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if c := sts.Spec.Template.Spec.TopologySpreadConstraints; len(c) != 1 || c[0].TopologyKey != "zone" {
				t.Errorf("topology spread %+v", c)
			}
		}},
	{"spec.statefulSet.pod.priorityClassName", podSpec(tsv1alpha1.Pod{PriorityClassName: "critical"}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Spec.Template.Spec.PriorityClassName != "critical" {
				t.Errorf("priority class %q", sts.Spec.Template.Spec.PriorityClassName)
			}
		}},
	{"spec.statefulSet.pod.securityContext", podSpec(tsv1alpha1.Pod{SecurityContext: &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000),
		Sysctls: []corev1.Sysctl{{Name: proxies.SysctlIPv4Forward, Value: "1"}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			ps := sts.Spec.Template.Spec
			if ps.SecurityContext == nil || ptr.Deref(ps.SecurityContext.FSGroup, 0) != 2000 || len(ps.InitContainers) != 0 {
				t.Errorf("Pod security context %+v, init containers %d: want the class's, forwarding by sysctl without the init container",
					ps.SecurityContext, len(ps.InitContainers))
			}
		}},
	{"spec.statefulSet.pod.imagePullSecrets", podSpec(tsv1alpha1.Pod{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if s := sts.Spec.Template.Spec.ImagePullSecrets; len(s) != 1 || s[0].Name != "registry" {
				t.Errorf("image pull secrets %+v", s)
			}
		}},
	{"spec.statefulSet.pod.dnsPolicy", podSpec(tsv1alpha1.Pod{DNSPolicy: ptr.To(corev1.DNSNone)}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sts.Spec.Template.Spec.DNSPolicy != corev1.DNSNone {
				t.Errorf("DNS policy %q", sts.Spec.Template.Spec.DNSPolicy)
			}
		}},
	{"spec.statefulSet.pod.dnsConfig", podSpec(tsv1alpha1.Pod{DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"10.0.0.10"}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if c := sts.Spec.Template.Spec.DNSConfig; c == nil || c.Nameservers[0] != "10.0.0.10" {
				t.Errorf("DNS config %+v", c)
			}
		}},
	{"spec.statefulSet.pod.tailscaleContainer.env", podSpec(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Env: []tsv1alpha1.Env{{Name: "POD_IP", Value: "x"}, {Name: "EXTRA", Value: "y"}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			env := sts.Spec.Template.Spec.Containers[0].Env
			// Appended: the last of a name wins in a container's environment.
			if proxytest.EnvValue(env[len(env)-2:], "POD_IP") != "x" || proxytest.EnvValue(env, "EXTRA") != "y" {
				t.Errorf("proxy env %+v", env)
			}
		}},
	{"spec.statefulSet.pod.tailscaleContainer.image", podSpec(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Image: "mirror/proxy:1"}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if c := sts.Spec.Template.Spec; c.Containers[0].Image != "mirror/proxy:1" || c.InitContainers[0].Image != "proxy:test" {
				t.Errorf("images %s (init %s)", c.Containers[0].Image, c.InitContainers[0].Image)
			}
		}},
	{"spec.statefulSet.pod.tailscaleContainer.imagePullPolicy", podSpec(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{ImagePullPolicy: corev1.PullAlways}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if p := sts.Spec.Template.Spec.Containers[0].ImagePullPolicy; p != corev1.PullAlways {
				t.Errorf("pull policy %q", p)
			}
		}},
	{"spec.statefulSet.pod.tailscaleContainer.resources", podSpec(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceMemory: proxies.MustQuantity("256Mi")}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if r := sts.Spec.Template.Spec.Containers[0].Resources; !r.Limits.Memory().Equal(proxies.MustQuantity("256Mi")) {
				t.Errorf("resources %+v", r)
			}
		}},
	{"spec.statefulSet.pod.tailscaleContainer.securityContext", podSpec(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: ptr.To[int64](3)}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sc := sts.Spec.Template.Spec.Containers[0].SecurityContext; sc == nil || ptr.Deref(sc.RunAsGroup, 0) != 3 {
				t.Errorf("security context %+v", sc)
			}
		}},
	{"spec.statefulSet.pod.tailscaleContainer.debug.enable", podSpec(tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Debug: &tsv1alpha1.Debug{Enable: true}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			c := sts.Spec.Template.Spec.Containers[0]
			if !slices.Contains(c.Args, "--debug-addr=:9001") || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "debug" && p.ContainerPort == 9001 }) {
				t.Errorf("args %v ports %+v, want the debug endpoint on 9001", c.Args, c.Ports)
			}
		}},
	{"spec.statefulSet.pod.tailscaleInitContainer.env", podSpec(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{Env: []tsv1alpha1.Env{{Name: "EXTRA", Value: "y"}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if proxytest.EnvValue(sts.Spec.Template.Spec.InitContainers[0].Env, "EXTRA") != "y" {
				t.Errorf("init env %+v", sts.Spec.Template.Spec.InitContainers[0].Env)
			}
		}},
	{"spec.statefulSet.pod.tailscaleInitContainer.image", podSpec(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{Image: "mirror/proxy:1"}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if c := sts.Spec.Template.Spec; c.InitContainers[0].Image != "mirror/proxy:1" || c.Containers[0].Image != "proxy:test" {
				t.Errorf("images: init %s, proxy %s", c.InitContainers[0].Image, c.Containers[0].Image)
			}
		}},
	{"spec.statefulSet.pod.tailscaleInitContainer.imagePullPolicy", podSpec(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{ImagePullPolicy: corev1.PullNever}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if p := sts.Spec.Template.Spec.InitContainers[0].ImagePullPolicy; p != corev1.PullNever {
				t.Errorf("init pull policy %q", p)
			}
		}},
	{"spec.statefulSet.pod.tailscaleInitContainer.resources", podSpec(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceMemory: proxies.MustQuantity("16Mi")}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if r := sts.Spec.Template.Spec.InitContainers[0].Resources; !r.Limits.Memory().Equal(proxies.MustQuantity("16Mi")) {
				t.Errorf("init resources %+v", r)
			}
		}},
	{"spec.statefulSet.pod.tailscaleInitContainer.securityContext", podSpec(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{
		Privileged: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}}}),
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			if sc := sts.Spec.Template.Spec.InitContainers[0].SecurityContext; sc == nil || sc.SeccompProfile == nil {
				t.Errorf("init security context %+v", sc)
			}
		}},
	{"spec.metrics.enable", tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true}},
		func(t *testing.T, sts *appsv1.StatefulSet, cfg *contract.ProxyConfig) {
			if !cfg.Metrics {
				t.Error("the proxy config does not enable metrics")
			}
			svc, _ := proxies.ProxyMetricsObjects(sts.Name, sts.Namespace, sts.Labels, sts.Spec.Selector.MatchLabels, &tsv1alpha1.ProxyClass{Spec: tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true}}})
			if svc == nil || svc.Name != sts.Name+"-metrics" {
				t.Errorf("metrics Service %+v", svc)
			}
		}},
	{"spec.metrics.serviceMonitor.enable", tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true}}},
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			spec := tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true}}}
			if _, sm := proxies.ProxyMetricsObjects(sts.Name, sts.Namespace, sts.Labels, sts.Spec.Selector.MatchLabels, &tsv1alpha1.ProxyClass{Spec: spec}); sm == nil {
				t.Error("no ServiceMonitor")
			}
		}},
	{"spec.metrics.serviceMonitor.labels", tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true, Labels: map[string]string{"release": "prom"}}}},
		func(t *testing.T, sts *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			spec := tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true, Labels: map[string]string{"release": "prom"}}}}
			if _, sm := proxies.ProxyMetricsObjects(sts.Name, sts.Namespace, sts.Labels, sts.Spec.Selector.MatchLabels, &tsv1alpha1.ProxyClass{Spec: spec}); sm.GetLabels()["release"] != "prom" {
				t.Errorf("ServiceMonitor labels %v", sm.GetLabels())
			}
		}},
	{"spec.tailscale.acceptRoutes", tsv1alpha1.ProxyClassSpec{Tailscale: &tsv1alpha1.TailscaleConfig{AcceptRoutes: true}},
		func(t *testing.T, _ *appsv1.StatefulSet, cfg *contract.ProxyConfig) {
			if !cfg.AcceptRoutes {
				t.Error("the proxy config does not accept routes")
			}
		}},
	{"spec.useLetsEncryptStagingEnvironment", tsv1alpha1.ProxyClassSpec{UseLetsEncryptStagingEnvironment: true},
		func(t *testing.T, _ *appsv1.StatefulSet, _ *contract.ProxyConfig) {
			// The directory of the proxies that get certificates (Ingresses', ProxyGroups').
			class := &tsv1alpha1.ProxyClass{Spec: tsv1alpha1.ProxyClassSpec{UseLetsEncryptStagingEnvironment: true}}
			if d := proxies.ACMEDirectory(kit.Settings{ACMEDirectoryURL: "https://ca.example/dir"}, class); d != proxies.LetsEncryptStaging {
				t.Errorf("ACME directory %q", d)
			}
		}},
}

func podSpec(p tsv1alpha1.Pod) tsv1alpha1.ProxyClassSpec {
	return tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &p}}
}

// Each ProxyClass field reaches the proxy as its documentation says: the StatefulSet of an L3
// proxy (which has the forwarding init container) and the proxy's config.
func TestProxyClassFields(t *testing.T) {
	for _, tc := range proxyClassFieldCases {
		t.Run(tc.field, func(t *testing.T) {
			class := &tsv1alpha1.ProxyClass{Spec: tc.spec}
			s := kit.Settings{Namespace: "tailscale", ProxyImage: "proxy:test"}
			p := &proxies.StandaloneProxy{Parent: proxies.Parent{Typ: proxies.ParentTypeService, Namespace: "ns", Name: "p"}, Class: class, Kernel: true,
				Config: contract.ProxyConfig{Kind: contract.KindService}}
			tc.check(t, p.BuildStatefulSet(s), p.ProxyConfig(""))
		})
	}
}

// fieldPaths lists the JSON paths of a type's fields, descending into this API's own structs
// (not Kubernetes types, which the operator passes on whole).
func fieldPaths(prefix string, typ reflect.Type) []string {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	var out []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + "." + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() == reflect.TypeFor[tsv1alpha1.ProxyClass]().PkgPath() {
			out = append(out, fieldPaths(path, ft)...)
			continue
		}
		out = append(out, path)
	}
	return out
}

// docs/proxyclass.md has a row for every ProxyClass and ProxyGroup field, naming what proves
// it; every ProxyClass field it names as proved by TestProxyClassFields has a case there.
func TestProxyClassFieldTableIsComplete(t *testing.T) {
	b, err := docstest.Read("proxyclass.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(spec\\.[A-Za-z.]+)` \\|(.*)\\|(.*)\\|$")
	documented := map[string]string{} // field → the tests column
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = m[3]
	}
	fields := append(fieldPaths("spec", reflect.TypeFor[tsv1alpha1.ProxyClassSpec]()),
		fieldPaths("spec", reflect.TypeFor[tsv1alpha1.ProxyGroupSpec]())...)
	cases := map[string]bool{}
	for _, c := range proxyClassFieldCases {
		cases[c.field] = true
	}
	for _, f := range fields {
		tests, ok := documented[f]
		switch {
		case !ok:
			t.Errorf("docs/proxyclass.md has no row for %s", f)
		case strings.TrimSpace(tests) == "":
			t.Errorf("docs/proxyclass.md names no test for %s", f)
		case strings.Contains(tests, "TestProxyClassFields") && !cases[f]:
			t.Errorf("docs/proxyclass.md says TestProxyClassFields proves %s, which has no case there", f)
		}
	}
	for f := range documented {
		if !slices.Contains(fields, f) {
			t.Errorf("docs/proxyclass.md documents %s, which is no field", f)
		}
	}
}
