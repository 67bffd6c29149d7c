package proxies

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/utils/ptr"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

// A ProxyClass's security contexts are merged over the operator's field by field, for L7 proxies,
// L3 proxies and ProxyGroup replicas (all built by ProxyPods; a group's are kernel proxies) and the
// forwarding init container: what the class leaves unset keeps the default, and a protection goes
// only by an explicit field.
func TestProxyClassSecurityContextMerged(t *testing.T) {
	runtimeDefault := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	dropAll := []corev1.Capability{"ALL"}
	for _, tc := range []struct {
		name   string
		kernel bool
		pod    tsv1alpha1.Pod
		// Wanted security contexts of the Pod, the proxy container and the init container (nil: none).
		wantPod       *corev1.PodSecurityContext
		wantContainer *corev1.SecurityContext
		wantInit      *corev1.SecurityContext
	}{
		{name: "L7 proxy, no class settings",
			wantPod: &corev1.PodSecurityContext{SeccompProfile: runtimeDefault, RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532)},
			wantContainer: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
				Capabilities: &corev1.Capabilities{Drop: dropAll}}},
		{name: "L7 proxy, class sets a group and an fsGroup only",
			pod: tsv1alpha1.Pod{SecurityContext: &corev1.PodSecurityContext{RunAsGroup: ptr.To[int64](3000), FSGroup: ptr.To[int64](2000)},
				TailscaleContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: ptr.To[int64](3000)}}},
			wantPod: &corev1.PodSecurityContext{SeccompProfile: runtimeDefault, RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				RunAsGroup: ptr.To[int64](3000), FSGroup: ptr.To[int64](2000)},
			wantContainer: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
				Capabilities: &corev1.Capabilities{Drop: dropAll}, RunAsGroup: ptr.To[int64](3000)}},
		{name: "L7 proxy, class adds a capability: ALL stays dropped",
			pod: tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{
				Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}}}}},
			wantPod: &corev1.PodSecurityContext{SeccompProfile: runtimeDefault, RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532)},
			wantContainer: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
				Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: dropAll}}},
		{name: "L7 proxy, class turns protections off explicitly",
			pod: tsv1alpha1.Pod{
				SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(false), RunAsUser: ptr.To[int64](0),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}},
				TailscaleContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{
					ReadOnlyRootFilesystem: ptr.To(false), AllowPrivilegeEscalation: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{}}}}},
			wantPod: &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined},
				RunAsNonRoot: ptr.To(false), RunAsUser: ptr.To[int64](0)},
			wantContainer: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(false),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{}}}},
		{name: "L3 proxy or ProxyGroup replica, class sets a group",
			kernel: true,
			pod: tsv1alpha1.Pod{SecurityContext: &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000)},
				TailscaleContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: ptr.To[int64](3000)}}},
			wantPod: &corev1.PodSecurityContext{SeccompProfile: runtimeDefault, FSGroup: ptr.To[int64](2000)},
			wantContainer: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(false), RunAsGroup: ptr.To[int64](3000),
				Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}, Drop: dropAll}},
			wantInit: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(false)}},
		{name: "L3 proxy or ProxyGroup replica, class narrows the capabilities and the init container's seccomp",
			kernel: true,
			pod: tsv1alpha1.Pod{
				TailscaleContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{
					Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}, ReadOnlyRootFilesystem: ptr.To(true)}},
				TailscaleInitContainer: &tsv1alpha1.Container{SecurityContext: &corev1.SecurityContext{SeccompProfile: runtimeDefault}}},
			wantPod: &corev1.PodSecurityContext{SeccompProfile: runtimeDefault},
			wantContainer: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
				Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}, Drop: dropAll}},
			wantInit: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(false), SeccompProfile: runtimeDefault}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := ProxyPods{Name: "p", Namespace: "tailscale", Labels: map[string]string{"a": "b"}, Selector: map[string]string{"a": "b"},
				Replicas: 1, Kernel: tc.kernel, Image: "proxy:test", Class: classWithPod(tc.pod)}
			ps := pp.Build().Spec.Template.Spec
			if !equality.Semantic.DeepEqual(tc.wantPod, ps.SecurityContext) {
				t.Errorf("Pod security context (-want +got):\n%s", diff.Diff(tc.wantPod, ps.SecurityContext))
			}
			if !equality.Semantic.DeepEqual(tc.wantContainer, ps.Containers[0].SecurityContext) {
				t.Errorf("proxy container security context (-want +got):\n%s", diff.Diff(tc.wantContainer, ps.Containers[0].SecurityContext))
			}
			if tc.wantInit != nil {
				if len(ps.InitContainers) != 1 {
					t.Fatalf("%d init containers, want the forwarding one", len(ps.InitContainers))
				}
				if !equality.Semantic.DeepEqual(tc.wantInit, ps.InitContainers[0].SecurityContext) {
					t.Errorf("init container security context (-want +got):\n%s", diff.Diff(tc.wantInit, ps.InitContainers[0].SecurityContext))
				}
			}
		})
	}
}

// Every field of the Kubernetes security contexts a class sets wins over the default, so a field
// added to the API is not silently dropped by the merge: the test sets each field alone.
func TestSecurityContextMergeCoversEveryField(t *testing.T) {
	basePod := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532)}
	eachField(t, basePod, func(class *corev1.PodSecurityContext) *corev1.PodSecurityContext {
		return mergePodSecurity(basePod, class)
	})
	base := &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true)}
	eachField(t, base, func(class *corev1.SecurityContext) *corev1.SecurityContext { return mergeSecurity(base, class) })
}

// eachField sets one field of a T at a time to a value unlike base's (a pointer to a zero value,
// or a one-element list; capabilities with both lists) and checks that merge keeps it.
func eachField[T any](t *testing.T, base *T, merge func(*T) *T) {
	t.Helper()
	typ := reflect.TypeFor[T]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		class := new(T)
		v := reflect.ValueOf(class).Elem().Field(i)
		switch f.Type.Kind() {
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
			if caps, ok := v.Interface().(*corev1.Capabilities); ok {
				caps.Add, caps.Drop = []corev1.Capability{"A"}, []corev1.Capability{"D"}
			}
		case reflect.Slice:
			v.Set(reflect.MakeSlice(f.Type, 1, 1))
		default:
			t.Fatalf("%s.%s is a %s: the test knows only pointers and lists", typ.Name(), f.Name, f.Type.Kind())
		}
		got := reflect.ValueOf(merge(class)).Elem().Field(i)
		if !reflect.DeepEqual(got.Interface(), v.Interface()) {
			t.Errorf("%s.%s set by the class to %#v, merged %#v: the merge ignores the field", typ.Name(), f.Name, v.Interface(), got.Interface())
		}
		if reflect.DeepEqual(reflect.ValueOf(base).Elem().Field(i).Interface(), v.Interface()) {
			t.Fatalf("%s.%s: the class's value equals the default's, which proves nothing", typ.Name(), f.Name)
		}
	}
}
