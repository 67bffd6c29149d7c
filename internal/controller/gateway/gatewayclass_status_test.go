package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/consts"
	"sigs.k8s.io/yaml"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

func TestClassStatus(t *testing.T) {
	type cond struct {
		status  metav1.ConditionStatus
		reason  string
		message string // a part of it
	}
	for name, c := range map[string]struct {
		scope                      classScope
		accepted, supportedVersion cond
	}{
		"no parameters, supported version": {classScope{bundleVersion: "v1.6.3"},
			cond{metav1.ConditionTrue, kit.ReasonGatewayClassAccepted, "tailscale.com/gateway-controller"},
			cond{metav1.ConditionTrue, kit.ReasonSupportedVersion, "v1.6.3"}},
		"another patch release of the supported minor": {classScope{bundleVersion: "v1.6.0"},
			cond{metav1.ConditionTrue, kit.ReasonGatewayClassAccepted, ""},
			cond{metav1.ConditionTrue, kit.ReasonSupportedVersion, "v1.6.x"}},
		"invalid parameters": {classScope{bundleVersion: "v1.6.3", invalidParams: `ProxyClass "x" does not exist`},
			cond{metav1.ConditionFalse, kit.ReasonInvalidParameters, `ProxyClass "x" does not exist`},
			cond{metav1.ConditionTrue, kit.ReasonSupportedVersion, ""}},
		"older CRDs: accepted on a best-effort basis": {classScope{bundleVersion: "v1.5.1"},
			cond{metav1.ConditionTrue, kit.ReasonGatewayClassAccepted, ""},
			cond{metav1.ConditionFalse, kit.ReasonUnsupportedVersion, "v1.5.1"}},
		"newer CRDs": {classScope{bundleVersion: "v1.7.0"},
			cond{metav1.ConditionTrue, kit.ReasonGatewayClassAccepted, ""},
			cond{metav1.ConditionFalse, kit.ReasonUnsupportedVersion, "supported: v1.6.x"}},
		"no bundle version": {classScope{},
			cond{metav1.ConditionTrue, kit.ReasonGatewayClassAccepted, ""},
			cond{metav1.ConditionFalse, kit.ReasonUnsupportedVersion, consts.BundleVersionAnnotation}},
		"bundle version not semver": {classScope{bundleVersion: "1.6.3"},
			cond{metav1.ConditionTrue, kit.ReasonGatewayClassAccepted, ""},
			cond{metav1.ConditionFalse, kit.ReasonUnsupportedVersion, "1.6.3"}},
	} {
		t.Run(name, func(t *testing.T) {
			// As the API server defaults a new class, plus another controller's condition and a
			// feature nobody serves.
			prev := gatewayv1.GatewayClassStatus{
				Conditions: []metav1.Condition{
					{Type: conditionAccepted, Status: metav1.ConditionUnknown, Reason: "Pending"},
					{Type: "example.com/Other", Status: metav1.ConditionTrue, Reason: "Other"},
				},
				SupportedFeatures: []gatewayv1.SupportedFeature{{Name: "HTTPRoute"}},
			}
			st := classStatus(prev, c.scope, 4)
			if prev.Conditions[0].Status != metav1.ConditionUnknown || len(prev.SupportedFeatures) != 1 {
				t.Fatal("classStatus changed its input")
			}
			for typ, want := range map[string]cond{conditionAccepted: c.accepted, conditionSupportedVersion: c.supportedVersion} {
				got := meta.FindStatusCondition(st.Conditions, typ)
				if got == nil || got.Status != want.status || got.Reason != want.reason || got.ObservedGeneration != 4 ||
					!strings.Contains(got.Message, want.message) {
					t.Errorf("%s = %+v, want %s %s (message with %q) at generation 4", typ, got, want.status, want.reason, want.message)
				}
			}
			if other := meta.FindStatusCondition(st.Conditions, "example.com/Other"); other == nil || other.Reason != "Other" {
				t.Errorf("another controller's condition was not kept: %+v", st.Conditions)
			}
			if len(st.SupportedFeatures) != 0 {
				t.Errorf("supportedFeatures = %v; no Gateway is served yet, so none is supported", st.SupportedFeatures)
			}
		})
	}
}

// A class read from a stale cache (its conditions were written at a newer generation) is left
// as it is, as the spec asks.
func TestClassStatusStaleRead(t *testing.T) {
	prev := gatewayv1.GatewayClassStatus{Conditions: []metav1.Condition{
		{Type: conditionAccepted, Status: metav1.ConditionFalse, Reason: kit.ReasonInvalidParameters, ObservedGeneration: 5},
	}}
	st := classStatus(prev, classScope{bundleVersion: "v1.6.3"}, 4)
	if len(st.Conditions) != 1 || st.Conditions[0].Status != metav1.ConditionFalse || st.Conditions[0].ObservedGeneration != 5 {
		t.Errorf("status written from a stale read: %+v", st.Conditions)
	}
	st = classStatus(prev, classScope{bundleVersion: "v1.6.3"}, 5)
	if c := meta.FindStatusCondition(st.Conditions, conditionAccepted); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("at the current generation: Accepted = %+v, want True", c)
	}
}

// The reasons are the Gateway API's own: tools and users match on them.
func TestReasonsAreTheSpecs(t *testing.T) {
	for ours, spec := range map[string]gatewayv1.GatewayClassConditionReason{
		kit.ReasonGatewayClassAccepted: gatewayv1.GatewayClassReasonAccepted,
		kit.ReasonInvalidParameters:    gatewayv1.GatewayClassReasonInvalidParameters,
		kit.ReasonSupportedVersion:     gatewayv1.GatewayClassReasonSupportedVersion,
		kit.ReasonUnsupportedVersion:   gatewayv1.GatewayClassReasonUnsupportedVersion,
	} {
		if ours != string(spec) {
			t.Errorf("reason %q, the spec's is %q", ours, spec)
		}
	}
}

// The CRDs the tests install (make gateway-api-crds, from go.mod's module) are of the release
// the operator supports: a bump of the module without regenerating them fails here.
func TestTestCRDsAreTheSupportedRelease(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "config", "gateway-api", "*_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/gateway-api (make gateway-api-crds): %v", err)
	}
	crds := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(b, crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue // the upgrade policy shipped beside them
		}
		crds++
		if v := crd.Annotations[consts.BundleVersionAnnotation]; v != consts.BundleVersion || versionProblem(v) != "" {
			t.Errorf("%s: bundle version %q, the module's is %s (%s)", f, v, consts.BundleVersion, versionProblem(v))
		}
		if ch := crd.Annotations[consts.ChannelAnnotation]; ch != "standard" {
			t.Errorf("%s: channel %q, want standard", f, ch)
		}
		if crd.Name == GatewayClassCRD && !servesV1(crd) {
			t.Errorf("%s does not serve v1", f)
		}
	}
	if crds < 5 {
		t.Errorf("%d CRDs in config/gateway-api; the standard channel has more", crds)
	}
}

func servesV1(crd *apiextensionsv1.CustomResourceDefinition) bool {
	ready := crd.DeepCopy()
	ready.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}
	return crdReady(ready)
}

func TestCRDReady(t *testing.T) {
	crd := func(established bool, versions ...apiextensionsv1.CustomResourceDefinitionVersion) *apiextensionsv1.CustomResourceDefinition {
		c := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: versions}}
		if established {
			c.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{
				{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue},
				{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue},
			}
		}
		return c
	}
	v1 := apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true}
	v1beta1 := apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1beta1", Served: true}
	for name, c := range map[string]struct {
		crd  *apiextensionsv1.CustomResourceDefinition
		want bool
	}{
		"established, v1 served":    {crd(true, v1beta1, v1), true},
		"not established yet":       {crd(false, v1), false},
		"an old release without v1": {crd(true, v1beta1), false},
		"v1 present but not served": {crd(true, apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1"}), false},
	} {
		if got := crdReady(c.crd); got != c.want {
			t.Errorf("%s: crdReady = %v, want %v", name, got, c.want)
		}
	}
}
