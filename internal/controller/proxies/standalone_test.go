package proxies

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func classWithPod(p tsv1alpha1.Pod) *tsv1alpha1.ProxyClass {
	return &tsv1alpha1.ProxyClass{Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &p}}}
}

// How the forwarding of L3 proxies is set up: a privileged init container running the proxy
// image, which tailscaleInitContainer customises, unless the ProxyClass turns forwarding on with
// a Pod sysctl; L7 proxies get none. And log upload forbidden by the operator.
func TestProxyPodsForwardingAndLogs(t *testing.T) {
	forwardSysctl := &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}, {Name: "net.ipv6.conf.all.forwarding", Value: "1"}}}
	for _, tc := range []struct {
		name   string
		kernel bool
		noLogs bool
		class  *tsv1alpha1.ProxyClass
		// check inspects the init containers (nil: none wanted) and the Pod spec.
		wantInit func(t *testing.T, c corev1.Container)
		check    func(t *testing.T, ps corev1.PodSpec)
	}{
		{name: "L7 proxy", kernel: false},
		{name: "L3 proxy", kernel: true, wantInit: func(t *testing.T, c corev1.Container) {
			if c.Name != "sysctler" || c.Image != "proxy:test" || len(c.Args) != 1 || c.Args[0] != "sysctl" || len(c.Command) != 0 {
				t.Errorf("init container %s runs %v %v of %s, want the proxy image's `proxy sysctl`", c.Name, c.Command, c.Args, c.Image)
			}
			if sc := c.SecurityContext; sc == nil || !ptr.Deref(sc.Privileged, false) || ptr.Deref(sc.RunAsUser, -1) != 0 {
				t.Errorf("init container security context %+v, want privileged root", sc)
			}
		}},
		{name: "L3 proxy, ProxyClass customises the init container", kernel: true,
			class: classWithPod(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{
				Image: "mirror.example/proxy:test", ImagePullPolicy: corev1.PullAlways,
				Env:             []tsv1alpha1.Env{{Name: "HTTP_PROXY", Value: "http://proxy:3128"}},
				Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: MustQuantity("16Mi")}},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}},
			}}),
			wantInit: func(t *testing.T, c corev1.Container) {
				if c.Image != "mirror.example/proxy:test" || c.ImagePullPolicy != corev1.PullAlways || len(c.Env) != 1 || c.Env[0].Value != "http://proxy:3128" ||
					!c.Resources.Limits.Memory().Equal(MustQuantity("16Mi")) || c.SecurityContext.SeccompProfile == nil {
					t.Errorf("init container %+v, want the ProxyClass's image, pull policy, env, resources and security context", c)
				}
			},
			check: func(t *testing.T, ps corev1.PodSpec) {
				if ps.Containers[0].Image != "proxy:test" {
					t.Errorf("the proxy container's image changed to %s", ps.Containers[0].Image)
				}
			}},
		{name: "L3 proxy, forwarding by Pod sysctl", kernel: true,
			class: classWithPod(tsv1alpha1.Pod{SecurityContext: forwardSysctl, TailscaleInitContainer: &tsv1alpha1.Container{Image: "unused"}}),
			check: func(t *testing.T, ps corev1.PodSpec) {
				if ps.SecurityContext == nil || len(ps.SecurityContext.Sysctls) != 2 {
					t.Errorf("Pod security context %+v, want the ProxyClass's sysctls", ps.SecurityContext)
				}
			}},
		{name: "L3 proxy of an IPv6-only cluster, IPv6 forwarding by Pod sysctl", kernel: true,
			class: classWithPod(tsv1alpha1.Pod{SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv6.conf.all.forwarding", Value: "1"}}}}),
			check: func(t *testing.T, ps corev1.PodSpec) {
				if len(ps.InitContainers) != 0 {
					t.Errorf("init containers %v, want none: the class turns forwarding on", ps.InitContainers)
				}
			}},
		{name: "L3 proxy, a sysctl that leaves forwarding off", kernel: true,
			class: classWithPod(tsv1alpha1.Pod{SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "0"}}}}),
			wantInit: func(t *testing.T, c corev1.Container) {
				if c.Name != "sysctler" {
					t.Errorf("init container %s", c.Name)
				}
			}},
		{name: "L7 proxy ignores tailscaleInitContainer", kernel: false,
			class: classWithPod(tsv1alpha1.Pod{TailscaleInitContainer: &tsv1alpha1.Container{Image: "x"}})},
		{name: "log upload forbidden", kernel: false, noLogs: true, check: func(t *testing.T, ps corev1.PodSpec) {
			if v := proxytest.EnvValue(ps.Containers[0].Env, "TS_NO_LOGS_NO_SUPPORT"); v != "true" {
				t.Errorf("TS_NO_LOGS_NO_SUPPORT = %q, want true", v)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sts := ProxyPods{Name: "p", Namespace: "tailscale", Labels: map[string]string{"a": "b"}, Selector: map[string]string{"a": "b"},
				Replicas: 1, Kernel: tc.kernel, Image: "proxy:test", NoLogs: tc.noLogs, Class: tc.class}.Build()
			ps := sts.Spec.Template.Spec
			if tc.wantInit == nil {
				if len(ps.InitContainers) != 0 {
					t.Errorf("init containers %+v, want none", ps.InitContainers)
				}
			} else if len(ps.InitContainers) != 1 {
				t.Fatalf("%d init containers, want the forwarding one", len(ps.InitContainers))
			} else {
				tc.wantInit(t, ps.InitContainers[0])
			}
			if !tc.noLogs && proxytest.EnvValue(ps.Containers[0].Env, "TS_NO_LOGS_NO_SUPPORT") != "" {
				t.Error("TS_NO_LOGS_NO_SUPPORT set without the operator asking: the proxy decides")
			}
			if tc.check != nil {
				tc.check(t, ps)
			}
		})
	}
}

func TestPodRefused(t *testing.T) {
	pod := &corev1.Pod{}
	pod.Name = "ts-db-0"
	if msg := PodRefused(pod); msg != "" {
		t.Errorf("a pending Pod refused: %q", msg)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "SysctlForbidden",
		Message: "Pod forbidden sysctl: \"net.ipv4.ip_forward\" not allowlisted"}
	if msg := PodRefused(pod); msg != `the node refused to run the proxy Pod ts-db-0: SysctlForbidden: Pod forbidden sysctl: "net.ipv4.ip_forward" not allowlisted` {
		t.Errorf("message %q", msg)
	}
	if PodRefused(nil) != "" {
		t.Error("no Pod refused")
	}
}
