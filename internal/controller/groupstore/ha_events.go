package groupstore

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// Indexes of the objects served on ProxyGroups: by group, and by the hostname they claim there.
// With many objects on a group, listing them all per reconcile or per event made the
// operator's work grow with the square of their number.
const (
	IndexIngressGroup    = "tsingress.ingress.proxygroup"
	IndexIngressHostname = "tsingress.ingress.proxygroup-hostname"
	IndexServiceGroup    = "tsingress.service.proxygroup"
	IndexServiceHostname = "tsingress.service.proxygroup-hostname"
	// A ProxyGroup's Secrets, by group and type: thousands of certificate Secrets on a group
	// made every label-selected List scan every Secret of the namespace.
	IndexSecretGroupType = "tsingress.secret.proxygroup-type"
)

// SecretGroupType indexes a ProxyGroup's Secret by group and type (groupSecretType).
func SecretGroupType(o client.Object) []string {
	pg := groupOf(o)
	if pg == "" {
		return nil
	}
	return []string{groupSecretType(pg, o.GetLabels()[kit.LabelSecretType])}
}

func groupSecretType(pg, typ string) string { return pg + "/" + typ }

// GroupSecrets selects a ProxyGroup's Secrets of one type, through indexSecretGroupType.
func GroupSecrets(namespace string, g proxies.Group, typ string) []client.ListOption {
	labels := g.Labels()
	labels[kit.LabelSecretType] = typ
	return []client.ListOption{client.InNamespace(namespace), client.MatchingLabels(labels),
		client.MatchingFields{IndexSecretGroupType: groupSecretType(g.Name, typ)}}
}

// IndexGroupObjects registers the indexes, once per manager.
func IndexGroupObjects(mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	ctx := context.Background()
	onGroup := func(o client.Object) bool { return o.GetAnnotations()[kit.AnnotationProxyGroup] != "" }
	for _, x := range []struct {
		obj   client.Object
		field string
		value func(client.Object) string
	}{
		{&networkingv1.Ingress{}, IndexIngressGroup, func(o client.Object) string { return o.GetAnnotations()[kit.AnnotationProxyGroup] }},
		{&networkingv1.Ingress{}, IndexIngressHostname, func(o client.Object) string { return kit.IngressHostname(o.(*networkingv1.Ingress)) }},
		{&corev1.Service{}, IndexServiceGroup, func(o client.Object) string { return o.GetAnnotations()[kit.AnnotationProxyGroup] }},
		{&corev1.Service{}, IndexServiceHostname, func(o client.Object) string { return kit.HAServiceHostname(o.(*corev1.Service)) }},
	} {
		if err := idx.IndexField(ctx, x.obj, x.field, func(o client.Object) []string {
			if !onGroup(o) {
				return nil
			}
			return []string{x.value(o)}
		}); err != nil {
			return fmt.Errorf("adding the %s index: %w", x.field, err)
		}
	}
	return idx.IndexField(ctx, &corev1.Secret{}, IndexSecretGroupType, SecretGroupType)
}

// haControllerOptions let the reconcilers of objects on ProxyGroups run side by side: most of
// their time is spent waiting (the tailnet's API, the group writer, the certificate ledger),
// and the writers batch what they write at once, so that the more wait together, the more
// each write carries: with many objects on a group, throughput grows with this number.
var HAControllerOptions = controller.Options{MaxConcurrentReconciles: 128}

// OwnWrites drops the update events of an object on a ProxyGroup that show only what its
// reconciler wrote: its status, or its finalizer added. Each ran one more pass that found
// nothing to do, through the tailnet's API and the group writer; with many objects on a group
// such passes were most of what the writer waited for.
func OwnWrites(finalizer string) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		switch old := e.ObjectOld.(type) {
		case *networkingv1.Ingress:
			cur, ok := e.ObjectNew.(*networkingv1.Ingress)
			return !ok || !equality.Semantic.DeepEqual(old.Spec, cur.Spec) || !sameButFinalizer(old.ObjectMeta, cur.ObjectMeta, finalizer)
		case *corev1.Service:
			cur, ok := e.ObjectNew.(*corev1.Service)
			return !ok || !equality.Semantic.DeepEqual(old.Spec, cur.Spec) || !sameButFinalizer(old.ObjectMeta, cur.ObjectMeta, finalizer)
		}
		return true
	}}
}

// sameButFinalizer reports whether two versions of an object's metadata differ at most by
// finalizer being added (and so in resourceVersion and managed fields).
func sameButFinalizer(a, b metav1.ObjectMeta, finalizer string) bool {
	if !slices.Equal(a.Finalizers, b.Finalizers) &&
		(slices.Contains(a.Finalizers, finalizer) || !slices.Equal(append(slices.Clone(a.Finalizers), finalizer), b.Finalizers)) {
		return false
	}
	a.Finalizers, b.Finalizers = nil, nil
	a.ResourceVersion, b.ResourceVersion = "", ""
	a.ManagedFields, b.ManagedFields = nil, nil
	return equality.Semantic.DeepEqual(a, b)
}

// groupEvents maps the events of a ProxyGroup's own objects to the objects of one kind
// ("Ingress" or "Service") served on it that they concern:
//   - the ProxyGroup, and the creation or deletion of its (first) ConfigMap: every one;
//   - a replica's state Secret or another shard of its report: those whose services it
//     changed (advertised, certificate, Funnel, DNAT rules), or, in the state Secret, every
//     one when the replica itself changed;
//   - a group certificate Secret deleted: the one of that name, which creates it again;
//   - its ConfigMap changed by anyone but this operator's last write (a hand edit, garbage):
//     those whose entries changed, which write them again.
//
// Other changes, above all the group's own document writes and its replicas' config Secrets,
// which change with every object added, concern no object's status.
type groupEvents struct {
	C       client.Client
	Docs    documents
	Reports *proxies.Reports
	Kind    string
	// All lists the objects of the kind served on a group.
	All func(ctx context.Context, pg string) []reconcile.Request
}

type requestQueue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// handler counts every event of a report shard (Reports.Saw) before it queues what the
// event concerns: a reconcile it queues then reads the shards again.
func (e groupEvents) handler() handler.EventHandler {
	e.Reports.Watch()
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, ev event.CreateEvent, q requestQueue) {
			e.Reports.Saw(ev.Object)
			e.add(q, e.onCreateOrDelete(ctx, ev.Object, false))
		},
		DeleteFunc: func(ctx context.Context, ev event.DeleteEvent, q requestQueue) {
			e.Reports.Saw(ev.Object)
			e.add(q, e.onCreateOrDelete(ctx, ev.Object, true))
		},
		UpdateFunc: func(ctx context.Context, ev event.UpdateEvent, q requestQueue) {
			e.Reports.Saw(ev.ObjectNew)
			e.add(q, e.onUpdate(ctx, ev.ObjectOld, ev.ObjectNew))
		},
		GenericFunc: func(ctx context.Context, ev event.GenericEvent, q requestQueue) {
			e.Reports.Saw(ev.Object)
			e.add(q, e.onCreateOrDelete(ctx, ev.Object, false))
		},
	}
}

func (e groupEvents) add(q requestQueue, reqs []reconcile.Request) {
	for _, r := range reqs {
		q.Add(r)
	}
}

func (e groupEvents) onCreateOrDelete(ctx context.Context, o client.Object, deleted bool) []reconcile.Request {
	pg := groupOf(o)
	if pg == "" {
		return nil
	}
	switch o := o.(type) {
	case *corev1.ConfigMap:
		if o.Name != (proxies.Group{Name: pg}).ConfigMap() {
			return nil // another shard: its documents are ours
		}
		return e.All(ctx, pg)
	case *corev1.Secret:
		switch o.Labels[kit.LabelSecretType] {
		case proxies.SecretTypeState:
			return e.All(ctx, pg)
		case certs.SecretTypeGroupCert:
			if deleted {
				return e.owning(ctx, pg, []string{"svc:" + strings.SplitN(o.Name, ".", 2)[0]})
			}
		}
		return nil
	}
	return e.All(ctx, pg) // the ProxyGroup
}

func (e groupEvents) onUpdate(ctx context.Context, old, cur client.Object) []reconcile.Request {
	pg := groupOf(cur)
	if pg == "" {
		return nil
	}
	switch cur := cur.(type) {
	case *corev1.ConfigMap:
		if last, ok := e.Docs.W.last.Get(cur.Name); ok && last.UID == cur.UID && last.ResourceVersion == cur.ResourceVersion {
			return nil // the writer's own: the objects it wrote for are being reconciled
		}
		oldCM, ok := old.(*corev1.ConfigMap)
		if !ok {
			return e.All(ctx, pg)
		}
		return e.entriesChanged(e.Docs.W.content(oldCM), e.Docs.W.content(cur))
	case *corev1.Secret:
		// A report's shards change alone: each says what changed in its entries.
		if t := cur.Labels[kit.LabelSecretType]; t != proxies.SecretTypeState && t != proxies.SecretTypeReport {
			return nil
		}
		oldSecret, ok := old.(*corev1.Secret)
		if !ok {
			return e.All(ctx, pg)
		}
		names, all := changedServices(e.Reports, oldSecret, cur, cur.Labels[kit.LabelSecretType] == proxies.SecretTypeState)
		if all {
			return e.All(ctx, pg)
		}
		return e.owning(ctx, pg, names)
	}
	return e.All(ctx, pg)
}

// entriesChanged maps the entries that differ between two versions of a group's documents (a
// hand edit, garbage, an earlier write of ours) to the objects of the kind that own them in
// either version, so that each writes its entry again.
func (e groupEvents) entriesChanged(old, cur *groupContent) []reconcile.Request {
	changed := map[string]bool{}
	for _, name := range unionKeys(old.serve.Services, cur.serve.Services) {
		a, inA := old.serve.Services[name]
		b, inB := cur.serve.Services[name]
		if inA != inB || !reflect.DeepEqual(a, b) {
			changed[name] = true
		}
	}
	for _, name := range unionKeys(old.dnat.Services, cur.dnat.Services) {
		a, inA := old.dnat.Services[name]
		b, inB := cur.dnat.Services[name]
		if inA != inB || !reflect.DeepEqual(a, b) {
			changed[name] = true
		}
	}
	for _, name := range unionKeys(old.owners, cur.owners) {
		if old.owners[name] != cur.owners[name] {
			changed[name] = true
		}
	}
	seen := map[reconcile.Request]bool{}
	var reqs []reconcile.Request
	for name := range changed {
		for _, owner := range []string{old.owners[name], cur.owners[name]} {
			kind, key, ok := strings.Cut(owner, "/")
			if !ok || kind != e.Kind {
				continue
			}
			ns, n, _ := strings.Cut(key, "/")
			if r := (reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: n}}); !seen[r] {
				seen[r] = true
				reqs = append(reqs, r)
			}
		}
	}
	return reqs
}

// owning maps services to the objects of the kind whose entries they are on group pg.
func (e groupEvents) owning(ctx context.Context, pg string, svcNames []string) []reconcile.Request {
	if len(svcNames) == 0 {
		return nil
	}
	cms, err := e.Docs.groupConfigMaps(ctx)
	if err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range cms {
		if cms[i].Labels[kit.LabelParentName] != pg {
			continue
		}
		owners := e.Docs.W.content(&cms[i]).owners
		for _, name := range svcNames {
			kind, key, ok := strings.Cut(owners[name], "/")
			if !ok || kind != e.Kind {
				continue
			}
			ns, n, _ := strings.Cut(key, "/")
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: n}})
		}
	}
	return reqs
}

// changedServices compares two versions of a Secret of a replica's report: the services whose
// advertisement, certificate, Funnel or DNAT rules changed, or all when a report cannot be
// read or, in the state Secret (first), the replica's identity or Pod changed. Another shard
// names a new Pod with its first write: its entries say what changed.
func changedServices(reports *proxies.Reports, old, cur *corev1.Secret, first bool) (names []string, all bool) {
	a, errA := reports.ParseShard(old)
	b, errB := reports.ParseShard(cur)
	if errA != nil || errB != nil || (first && (a.PodUID != b.PodUID || a.FQDN != b.FQDN || a.DeviceID != b.DeviceID)) {
		return nil, true
	}
	changed := map[string]bool{}
	inA, inB := setOf(a.Advertised), setOf(b.Advertised)
	for n := range inA {
		if !inB[n] {
			changed[n] = true
		}
	}
	for n := range inB {
		if !inA[n] {
			changed[n] = true
		}
	}
	for _, name := range unionKeys(a.Certificates, b.Certificates) {
		if a.Certificates[name] != b.Certificates[name] {
			changed["svc:"+strings.SplitN(name, ".", 2)[0]] = true
		}
	}
	for _, name := range unionKeys(a.Funnel, b.Funnel) {
		if a.Funnel[name] != b.Funnel[name] {
			changed["svc:"+strings.SplitN(name, ".", 2)[0]] = true
		}
	}
	var am, bm map[string]contract.AppliedDNAT
	if a.Firewall != nil {
		am = a.Firewall.Mappings
	}
	if b.Firewall != nil {
		bm = b.Firewall.Mappings
	}
	for _, name := range unionKeys(am, bm) {
		if !reflect.DeepEqual(am[name], bm[name]) {
			changed[name] = true
		}
	}
	return slices.Sorted(maps.Keys(changed)), false
}

func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}

func setOf(names []string) map[string]bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set
}
