package credsearch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

// Haystacks of a cluster besides logs and Events.
const (
	InPodSpecs    = "Pod specs"
	InStatus      = "object status"
	InAnnotations = "annotations"
)

// lastApplied is kubectl's copy of an applied object: on a Secret, its data, as readable as the
// Secret itself.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// objects collects, cluster-wide, every Pod's spec (env, args, volumes) and the status and
// annotations of every kind the operator reads or writes: where a credential must never be.
func objects(ctx context.Context, c client.Client) (map[string][]byte, error) {
	out := map[string][]byte{}
	add := func(where string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		out[where] = append(append(out[where], b...), '\n')
		return nil
	}
	for _, list := range []client.ObjectList{&corev1.PodList{}, &corev1.ServiceList{}, &corev1.SecretList{}, &corev1.ConfigMapList{},
		&networkingv1.IngressList{}, &appsv1.StatefulSetList{}, &tsv1alpha1.ProxyGroupList{}, &tsv1alpha1.ProxyClassList{}} {
		if err := c.List(ctx, list); err != nil {
			return nil, fmt.Errorf("listing %T: %w", list, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			obj := item.(client.Object)
			ann := obj.GetAnnotations()
			if _, secret := obj.(*corev1.Secret); secret && ann[lastApplied] != "" {
				ann = maps.Clone(ann)
				delete(ann, lastApplied)
			}
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(item)
			if err != nil {
				return nil, err
			}
			if err := add(InAnnotations, ann); err != nil {
				return nil, err
			}
			if err := add(InStatus, u["status"]); err != nil {
				return nil, err
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				if err := add(InPodSpecs, pod.Spec); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

// Plant writes a made-up credential where a search of the cluster must find it: raw in an
// annotation of a ConfigMap, base64-encoded at an odd offset in an Event's message, both in
// namespace ns. It returns the credential, to be added to the needles, and the objects it made,
// to delete once searched.
func Plant(ctx context.Context, c client.Client, ns string) (string, []client.Object, error) {
	secret := "planted-credential-" + strings.ToLower(rand.Text())
	name := "credsearch-planted-" + strings.ToLower(rand.Text()[:8])
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"example.com/planted": secret}}}
	if err := c.Create(ctx, cm); err != nil {
		return "", nil, fmt.Errorf("planting a credential in an annotation: %w", err)
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: name, APIVersion: "v1"},
		Reason:         "Planted", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "credsearch"},
		Message: base64.StdEncoding.EncodeToString([]byte("x" + secret)),
	}
	if err := c.Create(ctx, ev); err != nil {
		return "", []client.Object{cm}, fmt.Errorf("planting a credential in an Event: %w", err)
	}
	return secret, []client.Object{cm, ev}, nil
}

// InEvents names the haystack of the Events.
const InEvents = "the Events"

// events collects the reason, message and reporter of every Event of the cluster, of both APIs,
// and returns how many there were.
func events(ctx context.Context, c client.Client) ([]byte, int, error) {
	var out bytes.Buffer
	core := &corev1.EventList{}
	if err := c.List(ctx, core); err != nil {
		return nil, 0, fmt.Errorf("listing core Events: %w", err)
	}
	for _, e := range core.Items {
		fmt.Fprintf(&out, "%s %s %s %s\n", e.Reason, e.Message, e.Source.Component, e.ReportingController)
	}
	events := &eventsv1.EventList{}
	if err := c.List(ctx, events); err != nil {
		return nil, 0, fmt.Errorf("listing events.k8s.io Events: %w", err)
	}
	for _, e := range events.Items {
		fmt.Fprintf(&out, "%s %s %s\n", e.Reason, e.Note, e.ReportingController)
	}
	return out.Bytes(), len(core.Items) + len(events.Items), nil
}

// Cluster collects the haystacks of a cluster besides logs: its Events and its objects (every
// Pod's spec, and the status and annotations of every kind the operator reads or writes). It
// returns how many Events there were.
func Cluster(ctx context.Context, c client.Client) (map[string][]byte, int, error) {
	evs, count, err := events(ctx, c)
	if err != nil {
		return nil, 0, err
	}
	haystacks, err := objects(ctx, c)
	if err != nil {
		return nil, 0, err
	}
	haystacks[InEvents] = evs
	return haystacks, count, nil
}

// PodLogs reads the logs the kubelet keeps of every container of the Pods of namespace: the
// current run's and, for a container that restarted, the previous one's.
func PodLogs(ctx context.Context, cs kubernetes.Interface, namespace string) (map[string][]byte, error) {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the Pods of %s: %w", namespace, err)
	}
	out := map[string][]byte{}
	for _, pod := range pods.Items {
		for _, st := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
			for _, previous := range []bool{false, true} {
				if previous && st.RestartCount == 0 {
					continue
				}
				b, err := cs.CoreV1().Pods(namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: st.Name, Previous: previous}).DoRaw(ctx)
				if err != nil {
					continue // a container that has not started has no log
				}
				out[fmt.Sprintf("the log of %s/%s container %s (previous %v)", namespace, pod.Name, st.Name, previous)] = b
			}
		}
	}
	return out, nil
}

// Result is what SearchCluster found.
type Result struct {
	// PlantedHits are the finds of the planted credential, Hits those of every other needle.
	PlantedHits, Hits []string
	// Events is how many Events were searched, Bytes the size of every haystack.
	Events, Bytes int
}

// SearchCluster plants a credential in namespace ns (Plant), searches the cluster's haystacks
// (Cluster) and extra ones (logs) for needles and the planted credential, and removes what it
// planted.
func SearchCluster(ctx context.Context, c client.Client, ns string, needles *Needles, extra map[string][]byte) (_ Result, err error) {
	planted, made, err := Plant(ctx, c, ns)
	defer func() {
		for _, obj := range made {
			if derr := c.Delete(context.WithoutCancel(ctx), obj); derr != nil && err == nil {
				err = fmt.Errorf("removing what was planted: %w", derr)
			}
		}
	}()
	if err != nil {
		return Result{}, err
	}
	haystacks, events, err := Cluster(ctx, c)
	if err != nil {
		return Result{}, err
	}
	maps.Copy(haystacks, extra)
	needles.Add(planted, Planted)
	r := Result{Events: events}
	for _, text := range haystacks {
		r.Bytes += len(text)
	}
	r.PlantedHits, r.Hits = SplitPlanted(needles.Search(haystacks))
	return r, nil
}
