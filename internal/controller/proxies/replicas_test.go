package proxies

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// The names of a replica's Pod and Secrets: a standalone proxy's config and state share one
// Secret; a group's replicas read their config from a Secret of their own.
func TestReplicaSetNames(t *testing.T) {
	for _, tc := range []struct {
		set                       replicaSet
		i                         int
		pod, stateName, configNam string
	}{
		{replicaSet{name: "ts-default-web-1a2b3c4d"}, 0, "ts-default-web-1a2b3c4d-0", "ts-default-web-1a2b3c4d-0", "ts-default-web-1a2b3c4d-0"},
		{Group{"pg"}.Replicas(), 0, "pg-0", "pg-0", "pg-0-config"},
		{Group{"pg"}.Replicas(), 11, "pg-11", "pg-11", "pg-11-config"},
	} {
		if got := tc.set.pod(tc.i); got != tc.pod {
			t.Errorf("%+v pod(%d) = %q, want %q", tc.set, tc.i, got, tc.pod)
		}
		if got := tc.set.StateSecret(tc.i); got != tc.stateName {
			t.Errorf("%+v stateSecret(%d) = %q, want %q", tc.set, tc.i, got, tc.stateName)
		}
		if got := tc.set.ConfigSecret(tc.i); got != tc.configNam {
			t.Errorf("%+v configSecret(%d) = %q, want %q", tc.set, tc.i, got, tc.configNam)
		}
	}
	par := ParentOf(ParentTypeService, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}})
	if got, want := par.replicas().ConfigSecret(0), (&StandaloneProxy{Parent: par}).secretName(); got != want {
		t.Errorf("a standalone replica's config Secret is %q, its proxy's Secret %q", got, want)
	}
}

// A replica keeps its unused auth key, needs none once logged in, and gets a new one only when
// it has neither; what the config Secret records of its key goes along.
func TestKept(t *testing.T) {
	withKey := func(key string, ann map[string]string) *corev1.Secret {
		data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{Kind: contract.KindService, Hostname: "h", StateSecret: "h-0",
			Forward: &contract.Destination{DNSName: "db.example.com"}, AuthKey: key})
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Data: data}
	}
	loggedIn := &corev1.Secret{Data: map[string][]byte{contract.StateDeviceID: []byte("n123")}}
	recorded := map[string]string{AnnotationAuthKeyID: "k1", AnnotationAuthKeyNonce: "n1", AnnotationAuthKeyIntent: "n1"}
	for _, tc := range []struct {
		name          string
		state, config *corev1.Secret
		want          KeyGrant
		mint          bool
	}{
		{name: "nothing yet", mint: true},
		{name: "config without a key", config: withKey("", nil), mint: true},
		{name: "unused key", config: withKey("tskey-auth-1", recorded), want: KeyGrant{Key: "tskey-auth-1", ID: "k1", Nonce: "n1"}},
		{name: "logged in, key left in the config", state: loggedIn, config: withKey("tskey-auth-1", recorded), want: KeyGrant{Nonce: "n1"}},
		{name: "logged in", state: loggedIn, config: withKey("", recorded), want: KeyGrant{Nonce: "n1"}},
		{name: "config unreadable", config: &corev1.Secret{Data: map[string][]byte{"config": []byte("{")}}, mint: true},
	} {
		got, ok := kept(tc.state, tc.config)
		if got != tc.want || ok == tc.mint {
			t.Errorf("%s: kept = %+v, %v; want %+v, %v", tc.name, got, ok, tc.want, !tc.mint)
		}
	}
}

// A key's description is what the admin console shows, cut to the control plane's limit so
// that the nonce that finds it again always ends it.
func TestKeyDescription(t *testing.T) {
	for _, human := range []string{"tsingress Ingress default/web", "tsingress Service " + strings.Repeat("x", 80)} {
		d := keyDescription(human, "0123456789")
		if len(d) > tailnet.MaxKeyDescription || !strings.HasSuffix(d, " 0123456789") || !strings.HasPrefix(human, strings.TrimSuffix(d, " 0123456789")) {
			t.Errorf("keyDescription(%q) = %q (%d characters)", human, d, len(d))
		}
	}
}

// Which ProxyClass applies: a group's own, an object's label over its annotation, else the
// operator's default.
func TestProxyClassOf(t *testing.T) {
	svc := func(labels, annotations map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations}}
	}
	for _, tc := range []struct {
		name string
		obj  client.Object
		def  string
		want string
	}{
		{"group's own", &tsv1alpha1.ProxyGroup{Spec: tsv1alpha1.ProxyGroupSpec{ProxyClass: "mine"}}, "default", "mine"},
		{"group on the default", &tsv1alpha1.ProxyGroup{}, "default", "default"},
		{"group, no default", &tsv1alpha1.ProxyGroup{}, "", ""},
		{"group's label is not read", &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{kit.LabelProxyClass: "l"}}}, "", ""},
		{"label over annotation", svc(map[string]string{kit.LabelProxyClass: "l"}, map[string]string{kit.LabelProxyClass: "a"}), "default", "l"},
		{"annotation", svc(nil, map[string]string{kit.LabelProxyClass: "a"}), "default", "a"},
		{"default", svc(nil, nil), "default", "default"},
		{"none", svc(nil, nil), "", ""},
	} {
		if got := ProxyClassOf(tc.obj, tc.def); got != tc.want {
			t.Errorf("%s: proxyClassOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A ProxyClass configures proxies once it is ready for its generation; a staging class
// describes the proxies configured with it whether it is being validated again or not.
func TestAppliedClass(t *testing.T) {
	class := func(gen, observed int64, status metav1.ConditionStatus, staging bool) *tsv1alpha1.ProxyClass {
		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "c", Generation: gen},
			Spec: tsv1alpha1.ProxyClassSpec{UseLetsEncryptStagingEnvironment: staging}}
		if status != "" {
			pc.Status.Conditions = []metav1.Condition{{Type: tsv1alpha1.ProxyClassReady, Status: status, ObservedGeneration: observed}}
		}
		return pc
	}
	for _, tc := range []struct {
		name           string
		pc             *tsv1alpha1.ProxyClass
		notReady       string
		ready, staging bool
	}{
		{name: "missing", notReady: `ProxyClass "c" does not exist`},
		{name: "ready", pc: class(2, 2, metav1.ConditionTrue, false), ready: true},
		{name: "ready, staging", pc: class(2, 2, metav1.ConditionTrue, true), ready: true, staging: true},
		{name: "not validated yet", pc: class(1, 0, "", false), notReady: `ProxyClass "c" is not ready`},
		{name: "invalid", pc: class(1, 1, metav1.ConditionFalse, false), notReady: `ProxyClass "c" is not ready`},
		{name: "changed, being validated again", pc: class(3, 2, metav1.ConditionTrue, true), notReady: `ProxyClass "c" is not ready`, staging: true},
	} {
		a := appliedClass{found: tc.pc, NotReady: classNotReady("c", tc.pc)}
		if a.NotReady != tc.notReady {
			t.Errorf("%s: notReady %q, want %q", tc.name, a.NotReady, tc.notReady)
		}
		if got := a.Ready() != nil; got != tc.ready {
			t.Errorf("%s: ready() != nil is %v, want %v", tc.name, got, tc.ready)
		}
		if a.Staging() != tc.staging {
			t.Errorf("%s: staging() = %v, want %v", tc.name, a.Staging(), tc.staging)
		}
	}
	if (appliedClass{}).Ready() != nil || (appliedClass{}).Staging() {
		t.Error("no class applies: ready() and staging() want none")
	}
}
