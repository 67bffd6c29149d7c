package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// ProxyClass and ProxyGroup fields, whole flow. One class sets most fields: an L3 Service's proxy
// Pod, as kube-controller-manager creates it, carries every one of them, the forwarding init
// container customised; an Ingress on the same class is served over the tailnet, with a Warning
// that its L7 proxy has no init container to customise. A class whose Pod sysctls leave no init
// container to customise is refused, saying why. A ProxyGroup's hostnamePrefix, tags, replicas
// and proxyClass reach its replica's tailnet device and Pod; a type this operator does not run is
// refused.
func TestProxyClassAndGroupFieldsWholeFlow(t *testing.T) {
	w := startWorld(t)
	const ns = "fields"
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := w.k8s.Create(w.ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "proxy-critical"}, Value: 1000}); err != nil {
		t.Fatal(err)
	}
	mem := func(s string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(s)}
	}
	tuned := &tsv1alpha1.ProxyClass{
		ObjectMeta: metav1.ObjectMeta{Name: "tuned"},
		Spec: tsv1alpha1.ProxyClassSpec{
			StatefulSet: &tsv1alpha1.StatefulSet{
				Labels:      map[string]string{"team": "net"},
				Annotations: map[string]string{"owner": "net-team"},
				Pod: &tsv1alpha1.Pod{
					Labels:      map[string]string{"team": "net"},
					Annotations: map[string]string{"scrape": "yes"},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
						Weight: 1, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "edge", Operator: corev1.NodeSelectorOpExists}}}}}}},
					Tolerations:               []corev1.Toleration{{Key: "edge", Operator: corev1.TolerationOpExists}},
					NodeSelector:              map[string]string{"kubernetes.io/os": "linux"},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: corev1.ScheduleAnyway}},
					PriorityClassName:         "proxy-critical",
					ImagePullSecrets:          []corev1.LocalObjectReference{{Name: "registry"}},
					DNSPolicy:                 ptr.To(corev1.DNSNone),
					DNSConfig:                 &corev1.PodDNSConfig{Nameservers: []string{"10.96.0.10"}},
					TailscaleContainer: &tsv1alpha1.Container{
						Env:       []tsv1alpha1.Env{{Name: "EXTRA", Value: "1"}},
						Resources: corev1.ResourceRequirements{Limits: mem("300Mi")},
						Debug:     &tsv1alpha1.Debug{Enable: true},
					},
					TailscaleInitContainer: &tsv1alpha1.Container{
						Image: "mirror.example/proxy:test", ImagePullPolicy: corev1.PullAlways,
						Env:       []tsv1alpha1.Env{{Name: "INIT_EXTRA", Value: "1"}},
						Resources: corev1.ResourceRequirements{Limits: mem("16Mi")},
					},
				},
			},
			Tailscale:                        &tsv1alpha1.TailscaleConfig{AcceptRoutes: true},
			UseLetsEncryptStagingEnvironment: true,
		},
	}
	contradiction := &tsv1alpha1.ProxyClass{
		ObjectMeta: metav1.ObjectMeta{Name: "contradiction"},
		Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{
			SecurityContext:        &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}}},
			TailscaleInitContainer: &tsv1alpha1.Container{Image: "mirror.example/proxy:test"},
		}}},
	}
	for _, pc := range []*tsv1alpha1.ProxyClass{tuned, contradiction} {
		if err := w.k8s.Create(w.ctx, pc); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 30*time.Second, "the contradicting class refused", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(contradiction), contradiction); err != nil {
			return err
		}
		c := meta.FindStatusCondition(contradiction.Status.Conditions, tsv1alpha1.ProxyClassReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != kit.ReasonProxyClassInvalid || !strings.Contains(c.Message, "tailscaleInitContainer cannot apply") {
			return fmt.Errorf("ProxyClassReady %+v", c)
		}
		return nil
	})

	// An L3 Service's proxy Pod carries the class.
	classed := map[string]string{kit.LabelProxyClass: tuned.Name}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db", Labels: classed},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(kit.LoadBalancerClass),
			Ports: []corev1.ServicePort{{Name: "pg", Port: 5432}}},
	}
	if err := w.k8s.Create(w.ctx, svc); err != nil {
		t.Fatal(err)
	}
	pod := proxyPodOf(t, w, client.MatchingLabels{kit.LabelParentType: "svc", kit.LabelParentNS: ns, kit.LabelParentName: "db"})
	sts := &appsv1.StatefulSet{}
	if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: strings.TrimSuffix(pod.Name, "-0")}, sts); err != nil {
		t.Fatal(err)
	}
	ps := pod.Spec
	for what, ok := range map[string]bool{
		"statefulSet.labels":                  sts.Labels["team"] == "net" && sts.Labels[kit.LabelManaged] == "true",
		"statefulSet.annotations":             sts.Annotations["owner"] == "net-team",
		"pod.labels":                          pod.Labels["team"] == "net",
		"pod.annotations":                     pod.Annotations["scrape"] == "yes",
		"pod.affinity":                        ps.Affinity != nil && ps.Affinity.NodeAffinity != nil,
		"pod.tolerations":                     slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool { return t.Key == "edge" }),
		"pod.nodeSelector":                    ps.NodeSelector["kubernetes.io/os"] == "linux",
		"pod.topologySpreadConstraints":       len(ps.TopologySpreadConstraints) == 1,
		"pod.priorityClassName":               ps.PriorityClassName == "proxy-critical" && ptr.Deref(ps.Priority, 0) == 1000,
		"pod.imagePullSecrets":                len(ps.ImagePullSecrets) == 1 && ps.ImagePullSecrets[0].Name == "registry",
		"pod.dnsPolicy, pod.dnsConfig":        ps.DNSPolicy == corev1.DNSNone && ps.DNSConfig != nil && ps.DNSConfig.Nameservers[0] == "10.96.0.10",
		"tailscaleContainer.env":              envOf(ps.Containers[0].Env, "EXTRA") == "1",
		"tailscaleContainer.resources":        ps.Containers[0].Resources.Limits.Memory().String() == "300Mi",
		"tailscaleContainer.debug":            slices.Contains(ps.Containers[0].Args, "--debug-addr=:9001"),
		"the init container":                  len(ps.InitContainers) == 1 && ps.InitContainers[0].Name == "sysctler",
		"tailscaleInitContainer.image":        len(ps.InitContainers) == 1 && ps.InitContainers[0].Image == "mirror.example/proxy:test" && ps.InitContainers[0].ImagePullPolicy == corev1.PullAlways,
		"tailscaleInitContainer.env":          len(ps.InitContainers) == 1 && envOf(ps.InitContainers[0].Env, "INIT_EXTRA") == "1",
		"tailscaleInitContainer.resources":    len(ps.InitContainers) == 1 && ps.InitContainers[0].Resources.Limits.Memory().String() == "16Mi",
		"the proxy container keeps its image": ps.Containers[0].Image == "unused",
	} {
		if !ok {
			t.Errorf("the L3 proxy Pod does not carry %s:\n%+v", what, ps)
		}
	}
	if cfg, _, err := contract.ProxyConfigs.Decode(mustSecret(t, w, pod.Name).Data); err != nil || !cfg.AcceptRoutes {
		t.Errorf("the L3 proxy's config does not accept routes (%v)", err)
	}

	// An Ingress on the class is served, told that its proxy has no init container.
	web := newRecordingBackend(t, "web")
	if err := w.k8s.Create(w.ctx, loopbackService(ns, "web", web.port())); err != nil {
		t.Fatal(err)
	}
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "site", Labels: classed},
		Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("tailscale"), TLS: []networkingv1.IngressTLS{{Hosts: []string{"site"}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http"}}}},
	}
	if err := w.k8s.Create(w.ctx, ing); err != nil {
		t.Fatal(err)
	}
	l7 := proxyPodOf(t, w, client.MatchingLabels{kit.LabelParentType: "ingress", kit.LabelParentNS: ns, kit.LabelParentName: "site"})
	if len(l7.Spec.InitContainers) != 0 || l7.Labels["team"] != "net" {
		t.Errorf("the L7 proxy Pod: %d init containers, labels %v; want none and the class's", len(l7.Spec.InitContainers), l7.Labels)
	}
	// Staging is for the proxies that get certificates.
	if cfg, _, err := contract.ProxyConfigs.Decode(mustSecret(t, w, l7.Name).Data); err != nil || !cfg.AcceptRoutes || cfg.TLS.ACMEDirectoryURL != proxies.LetsEncryptStaging {
		t.Errorf("the L7 proxy's config: acceptRoutes %v, ACME directory %q (%v)", cfg.AcceptRoutes, cfg.TLS.ACMEDirectoryURL, err)
	}
	poll.Eventually(t, 30*time.Second, "ProxyClassFieldIgnored on the Ingress", func() error {
		list := &eventsv1.EventList{}
		if err := w.k8s.List(w.ctx, list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == "site" && e.Reason == kit.ReasonProxyClassFieldIgnored && e.Type == corev1.EventTypeWarning &&
				strings.Contains(e.Note, "tailscaleInitContainer") {
				return nil
			}
		}
		return fmt.Errorf("%d Events, none %s", len(list.Items), kit.ReasonProxyClassFieldIgnored)
	})
	ca := proxytest.NewCA(t)
	runCtx, stop := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() {
		done <- proxy.Run(runCtx, proxy.Options{ConfigSecret: l7.Name, Kube: w.cp.Config, Namespace: w.opNS, PodUID: string(l7.UID),
			StateDir: t.TempDir(), CertSource: ca})
	}()
	t.Cleanup(func() { stop(); <-done }) //nolint:errcheck // how the proxy stops after the cancel is not what this test checks
	cl := joinClient(t, w, "laptop")
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	poll.Eventually(t, 60*time.Second, "the Ingress served over the tailnet", func() error {
		resp, err := httpc.Get("https://site.tailnet.test/x")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "web /x" {
			return fmt.Errorf("%d %q", resp.StatusCode, body)
		}
		return nil
	})

	// A ProxyGroup's fields reach its replica's device and Pod.
	group := &tsv1alpha1.ProxyGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "edge"},
		Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To[int32](1), HostnamePrefix: "edge-px",
			Tags: []tsv1alpha1.Tag{"tag:k8s-operator"}, ProxyClass: tuned.Name},
	}
	if err := w.k8s.Create(w.ctx, group); err != nil {
		t.Fatal(err)
	}
	// A Service on the group puts its replicas on the kernel path, with the class's init container.
	onGroup := loopbackService(ns, "edge-db", 5432)
	onGroup.Annotations = map[string]string{kit.AnnotationExpose: "true", kit.AnnotationProxyGroup: "edge"}
	if err := w.k8s.Create(w.ctx, onGroup); err != nil {
		t.Fatal(err)
	}
	replicaPod := &corev1.Pod{}
	poll.Eventually(t, 60*time.Second, "the replica's Pod with its ProxyClass", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: "edge-0"}, replicaPod); err != nil {
			return err
		}
		if ic := replicaPod.Spec.InitContainers; len(ic) != 1 || ic[0].Image != "mirror.example/proxy:test" || replicaPod.Labels["team"] != "net" {
			return fmt.Errorf("init containers %+v, labels %v", ic, replicaPod.Labels)
		}
		return nil
	})
	r := newHAReplica(t, w, "edge", 0, nil, "")
	r.start()
	poll.Eventually(t, 60*time.Second, "the replica on the tailnet as edge-px-0", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(group), group); err != nil {
			return err
		}
		if d := group.Status.Devices; len(d) != 1 || d[0].Hostname != "edge-px-0.tailnet.test" {
			return fmt.Errorf("devices %+v", d)
		}
		return nil
	})
	st, err := contract.ParseState(mustSecret(t, w, "edge-0").Data)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := w.api.Device(w.ctx, st.DeviceID); err != nil || !slices.Equal(d.Tags, []string{"tag:k8s-operator"}) {
		t.Errorf("the replica's device: tags %v (%v), want the group's tag:k8s-operator", d.Tags, err)
	}

	egress := &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: "out"}, Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeEgress}}
	if err := w.k8s.Create(w.ctx, egress); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "an egress group refused", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(egress), egress); err != nil {
			return err
		}
		c := meta.FindStatusCondition(egress.Status.Conditions, tsv1alpha1.ProxyGroupReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != kit.ReasonProxyGroupInvalid || !strings.Contains(c.Message, "only ingress") {
			return fmt.Errorf("ProxyGroupReady %+v", c)
		}
		return nil
	})
}

// proxyPodOf waits for the one proxy Pod with the given labels, as kube-controller-manager
// creates it from the operator's StatefulSet.
func proxyPodOf(t *testing.T, w *world, sel client.MatchingLabels) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	poll.Eventually(t, 30*time.Second, fmt.Sprintf("proxy Pod %v", sel), func() error {
		list := &corev1.PodList{}
		if err := w.k8s.List(w.ctx, list, client.InNamespace(w.opNS), sel); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Pods", len(list.Items))
		}
		pod = list.Items[0]
		return nil
	})
	return &pod
}

func envOf(env []corev1.EnvVar, name string) string {
	v := ""
	for _, e := range env {
		if e.Name == name {
			v = e.Value // the last one wins
		}
	}
	return v
}
