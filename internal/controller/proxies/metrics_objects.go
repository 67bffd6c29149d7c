package proxies

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// +kubebuilder:rbac:groups="",namespace=system,resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=monitoring.coreos.com,namespace=system,resources=servicemonitors,verbs=get;list;watch;create;update;patch;delete

// LabelMetrics marks a proxy's metrics Service, which its ServiceMonitor selects.
const LabelMetrics = "tailscale.com/metrics"

var serviceMonitorGVK = schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}

// metricsName names a proxy's metrics Service and ServiceMonitor.
func metricsName(proxy string) string { return proxy + "-metrics" }

// ProxyMetricsObjects are the metrics Service (nil unless the class enables metrics) and
// ServiceMonitor (nil unless it enables one too) of the proxy StatefulSet name, whose Pods
// selector selects, labelled with labels. The Service points at the proxies' health port,
// where they serve /metrics; the ServiceMonitor adds the parent's type, namespace and name as
// ts_proxy_* labels to what it scrapes, as the original operator's do.
func ProxyMetricsObjects(name, namespace string, labels, selector map[string]string, class *tsv1alpha1.ProxyClass) (*corev1.Service, *unstructured.Unstructured) {
	if !MetricsEnabled(class) {
		return nil, nil
	}
	svcLabels := maps.Clone(labels)
	svcLabels[LabelMetrics] = "true"
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: metricsName(name), Namespace: namespace, Labels: svcLabels},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selector,
			Ports: []corev1.ServicePort{{Name: "metrics", Port: HealthPort, TargetPort: intstr.FromString("health"),
				Protocol: corev1.ProtocolTCP}},
		},
	}
	sm := class.Spec.Metrics.ServiceMonitor
	if sm == nil || !sm.Enable {
		return svc, nil
	}
	// The user's labels, for their Prometheus to select on; the operator's own win.
	smLabels := mergeKeep(svcLabels, sm.Labels)
	relabel := func(from, to string) any {
		return map[string]any{"sourceLabels": []any{"__meta_kubernetes_service_label_" + promLabel(from)}, "targetLabel": to}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"endpoints": []any{map[string]any{
				"port": "metrics",
				"path": "/metrics",
				"relabelings": []any{
					relabel(kit.LabelParentType, "ts_proxy_type"),
					relabel(kit.LabelParentNS, "ts_proxy_parent_namespace"),
					relabel(kit.LabelParentName, "ts_proxy_parent_name"),
				},
			}},
			"namespaceSelector": map[string]any{"matchNames": []any{namespace}},
			"selector":          map[string]any{"matchLabels": toAny(svcLabels)},
		},
	}}
	u.SetGroupVersionKind(serviceMonitorGVK)
	u.SetName(metricsName(name))
	u.SetNamespace(namespace)
	u.SetLabels(smLabels)
	return svc, u
}

// promLabel is a Kubernetes label name as Prometheus's service discovery spells it.
func promLabel(k string) string {
	b := []byte(k)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// PlaceMetricsObjects applies a proxy's metrics objects in podNS, where its Pods run, as
// ApplyMetricsObjects does, and removes them from w's other namespaces, where they ran before.
func PlaceMetricsObjects(ctx context.Context, c client.Client, owner client.Object, w Where, name, podNS string, labels, selector map[string]string, class *tsv1alpha1.ProxyClass) error {
	for _, ns := range w.others(podNS) {
		if err := ApplyMetricsObjects(ctx, c, nil, name, ns, nil, nil, nil); err != nil {
			return err
		}
	}
	return ApplyMetricsObjects(ctx, c, owner, name, podNS, labels, selector, class)
}

// annotationServiceMonitor on a metrics Service records that the operator made its
// ServiceMonitor, so that it is removed when no longer wanted without asking for the kind on
// every pass (a cluster without the CRD would answer with a discovery miss each time).
const annotationServiceMonitor = "tailscale.com/service-monitor"

// ApplyMetricsObjects writes a proxy's metrics Service and ServiceMonitor as its class asks,
// and removes them when it does not. owner, when set, owns them (a ProxyGroup); otherwise the
// caller removes them with the proxy (a nil class).
func ApplyMetricsObjects(ctx context.Context, c client.Client, owner client.Object, name, namespace string, labels, selector map[string]string, class *tsv1alpha1.ProxyClass) error {
	svc, sm := ProxyMetricsObjects(name, namespace, labels, selector, class)
	existing := &corev1.Service{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: metricsName(name)}, existing)
	found := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading the metrics Service %s/%s: %w", namespace, metricsName(name), err)
	}
	if found && sm == nil && existing.Annotations[annotationServiceMonitor] == "true" {
		if err := removeMetricsMonitor(ctx, c, name, namespace); err != nil {
			return err
		}
	}
	if svc == nil {
		if found {
			if err := kit.Remove(ctx, c, existing); err != nil {
				return fmt.Errorf("deleting the metrics Service %s/%s: %w", namespace, existing.Name, err)
			}
		}
		return nil
	}
	objs := []client.Object{svc}
	if sm != nil {
		svc.Annotations = map[string]string{annotationServiceMonitor: "true"}
		objs = append(objs, sm)
	}
	for _, obj := range objs {
		if owner == nil {
			break
		}
		if err := controllerutil.SetControllerReference(owner, obj, c.Scheme()); err != nil {
			return fmt.Errorf("setting the owner of the metrics objects of %s/%s: %w", namespace, name, err)
		}
	}
	// The Service first: its annotation must be there whenever the ServiceMonitor is.
	if err := kit.Apply(ctx, c, svc); err != nil {
		return err
	}
	if sm != nil {
		return kit.Apply(ctx, c, sm)
	}
	return nil
}

func removeMetricsMonitor(ctx context.Context, c client.Client, name, namespace string) error {
	sm := &unstructured.Unstructured{}
	sm.SetGroupVersionKind(serviceMonitorGVK)
	sm.SetName(metricsName(name))
	sm.SetNamespace(namespace)
	if err := kit.Remove(ctx, c, sm); err != nil && !meta.IsNoMatchError(err) {
		return fmt.Errorf("deleting the ServiceMonitor %s/%s: %w", namespace, sm.GetName(), err)
	}
	return nil
}
