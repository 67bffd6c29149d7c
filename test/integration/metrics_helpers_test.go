package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/testing/poll"
)

// families are scraped or gathered metrics by name.
type families map[string]*dto.MetricFamily

// scrapeProxy reads a proxy's /metrics at its health address: the status, and the families
// when it serves them.
func scrapeProxy(health string) (int, families, error) {
	res, err := http.Get("http://" + health + "/metrics")
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return res.StatusCode, nil, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fs, err := p.TextToMetricFamilies(res.Body)
	return res.StatusCode, fs, err
}

// gather reads a registry, as its endpoint would serve it.
func gather(t *testing.T, g prometheus.Gatherer) families {
	t.Helper()
	list, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := families{}
	for _, f := range list {
		out[f.GetName()] = f
	}
	return out
}

// value is the value of the metric of a family whose labels include want, and whether there
// is one. A histogram's value is its count.
func (fs families) value(name string, want map[string]string) (float64, bool) {
	f := fs[name]
	if f == nil {
		return 0, false
	}
metrics:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue metrics
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// expectValue fails unless the metric exists and check accepts its value.
func (fs families) expectValue(name string, labels map[string]string, want string, check func(float64) bool) error {
	v, ok := fs.value(name, labels)
	if !ok || !check(v) {
		return fmt.Errorf("%s%v = %v (present: %v), want %s", name, labels, v, ok, want)
	}
	return nil
}

// installServiceMonitorCRD installs the Prometheus Operator's ServiceMonitor kind (its schema
// left open: the operator is what is tested) and waits until it is served.
func installServiceMonitorCRD(t *testing.T, w *world) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(w.cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "servicemonitors", Singular: "servicemonitor",
				Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true)}}}},
		},
	}
	if err := c.Create(w.ctx, crd); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "ServiceMonitor CRD established", func() error {
		if err := c.Get(w.ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
			return err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", crd.Status.Conditions)
	})
}
