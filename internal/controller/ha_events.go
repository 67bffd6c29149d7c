package controller

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tsingress/tsingress/internal/contract"
)

// Indexes of the objects served on ProxyGroups: by group, and by the hostname they claim there.
// With many objects on a group, listing them all per reconcile or per event made the
// operator's work grow with the square of their number.
const (
	indexIngressGroup    = "tsingress.ingress.proxygroup"
	indexIngressHostname = "tsingress.ingress.proxygroup-hostname"
	indexServiceGroup    = "tsingress.service.proxygroup"
	indexServiceHostname = "tsingress.service.proxygroup-hostname"
)

// indexGroupObjects registers the indexes, once per manager.
func indexGroupObjects(mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	ctx := context.Background()
	onGroup := func(o client.Object) bool { return o.GetAnnotations()[AnnotationProxyGroup] != "" }
	for _, x := range []struct {
		obj   client.Object
		field string
		value func(client.Object) string
	}{
		{&networkingv1.Ingress{}, indexIngressGroup, func(o client.Object) string { return o.GetAnnotations()[AnnotationProxyGroup] }},
		{&networkingv1.Ingress{}, indexIngressHostname, func(o client.Object) string { return ingressHostname(o.(*networkingv1.Ingress)) }},
		{&corev1.Service{}, indexServiceGroup, func(o client.Object) string { return o.GetAnnotations()[AnnotationProxyGroup] }},
		{&corev1.Service{}, indexServiceHostname, func(o client.Object) string { return haServiceHostname(o.(*corev1.Service)) }},
	} {
		if err := idx.IndexField(ctx, x.obj, x.field, func(o client.Object) []string {
			if !onGroup(o) {
				return nil
			}
			return []string{x.value(o)}
		}); err != nil {
			return err
		}
	}
	return nil
}

// haControllerOptions let the reconcilers of objects on ProxyGroups run side by side: most of
// their time is spent waiting (the tailnet's API, the group writer), and the group writer
// batches what they write at once.
var haControllerOptions = controller.Options{MaxConcurrentReconciles: 32}

// groupEvents maps the events of a ProxyGroup's own objects to the objects of one kind
// ("Ingress" or "Service") served on it that they concern:
//   - the ProxyGroup, and the creation or deletion of its ConfigMap: every one;
//   - a replica's state Secret: those whose services its report changed (advertised,
//     certificate, DNAT rules), or every one when the replica itself changed;
//   - a group certificate Secret deleted: the one of that name, which creates it again;
//   - a group ConfigMap changed by another writer than the operator's (a hand edit): those whose
//     entries it changed.
//
// Other changes, above all the group's own document writes and its replicas' config Secrets,
// which change with every object added, concern no object's status.
type groupEvents struct {
	c    client.Client
	docs groupDocs
	kind string
	// all lists the objects of the kind served on a group.
	all func(ctx context.Context, pg string) []reconcile.Request
}

type requestQueue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func (e groupEvents) handler() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, ev event.CreateEvent, q requestQueue) {
			e.add(q, e.onCreateOrDelete(ctx, ev.Object, false))
		},
		DeleteFunc: func(ctx context.Context, ev event.DeleteEvent, q requestQueue) {
			e.add(q, e.onCreateOrDelete(ctx, ev.Object, true))
		},
		UpdateFunc: func(ctx context.Context, ev event.UpdateEvent, q requestQueue) {
			e.add(q, e.onUpdate(ctx, ev.ObjectOld, ev.ObjectNew))
		},
		GenericFunc: func(ctx context.Context, ev event.GenericEvent, q requestQueue) {
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
		return e.all(ctx, pg)
	case *corev1.Secret:
		switch o.Labels[LabelSecretType] {
		case secretTypeState:
			return e.all(ctx, pg)
		case secretTypeGroupCert:
			if deleted {
				return e.owning(ctx, pg, []string{"svc:" + strings.SplitN(o.Name, ".", 2)[0]})
			}
		}
		return nil
	}
	return e.all(ctx, pg) // the ProxyGroup
}

func (e groupEvents) onUpdate(ctx context.Context, old, cur client.Object) []reconcile.Request {
	pg := groupOf(cur)
	if pg == "" {
		return nil
	}
	switch cur := cur.(type) {
	case *corev1.ConfigMap:
		oldCM, ok := old.(*corev1.ConfigMap)
		if !ok || e.docs.w.wrote(pg, cur) {
			return nil
		}
		// Written by someone else (a hand edit): the objects whose entries it changed, as
		// either version's owner index says, write theirs again.
		before, after := e.docs.w.content(oldCM), e.docs.w.content(cur)
		return e.ownedIn([]map[string]string{before.owners, after.owners}, changedEntries(before, after))
	case *corev1.Secret:
		if cur.Labels[LabelSecretType] != secretTypeState {
			return nil
		}
		oldSecret, ok := old.(*corev1.Secret)
		if !ok {
			return e.all(ctx, pg)
		}
		names, all := changedServices(oldSecret, cur)
		if all {
			return e.all(ctx, pg)
		}
		return e.owning(ctx, pg, names)
	}
	return e.all(ctx, pg)
}

// owning maps services to the objects of the kind whose entries they are on group pg.
func (e groupEvents) owning(ctx context.Context, pg string, svcNames []string) []reconcile.Request {
	if len(svcNames) == 0 {
		return nil
	}
	cms, err := e.docs.groupConfigMaps(ctx)
	if err != nil {
		return nil
	}
	var indexes []map[string]string
	for i := range cms {
		if cms[i].Labels[LabelParentName] == pg {
			indexes = append(indexes, e.docs.w.content(&cms[i]).owners)
		}
	}
	return e.ownedIn(indexes, svcNames)
}

// ownedIn maps services to the objects of the kind that own them in any of the owner indexes.
func (e groupEvents) ownedIn(indexes []map[string]string, svcNames []string) []reconcile.Request {
	var reqs []reconcile.Request
	for _, owners := range indexes {
		for _, name := range svcNames {
			kind, key, ok := strings.Cut(owners[name], "/")
			if !ok || kind != e.kind {
				continue
			}
			ns, n, _ := strings.Cut(key, "/")
			req := reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: n}}
			if !slices.Contains(reqs, req) {
				reqs = append(reqs, req)
			}
		}
	}
	return reqs
}

// changedEntries lists the services whose Serve or DNAT entry, or owner, differs between two
// versions of a group's documents. A document that cannot be read decodes as empty, so
// garbage changes every entry it held.
func changedEntries(a, b *groupContent) []string {
	changed := map[string]bool{}
	for _, name := range unionKeys(a.serve.Services, b.serve.Services) {
		if !reflect.DeepEqual(a.serve.Services[name], b.serve.Services[name]) {
			changed[name] = true
		}
	}
	for _, name := range unionKeys(a.dnat.Services, b.dnat.Services) {
		if !reflect.DeepEqual(a.dnat.Services[name], b.dnat.Services[name]) {
			changed[name] = true
		}
	}
	for _, name := range unionKeys(a.owners, b.owners) {
		if a.owners[name] != b.owners[name] {
			changed[name] = true
		}
	}
	return slices.Sorted(maps.Keys(changed))
}

// changedServices compares two reports of a replica: the services whose advertisement,
// certificate or DNAT rules changed, or all when the replica's identity or Pod did (or a report
// cannot be read).
func changedServices(old, cur *corev1.Secret) (names []string, all bool) {
	a, errA := contract.ParseState(old.Data)
	b, errB := contract.ParseState(cur.Data)
	if errA != nil || errB != nil || a.PodUID != b.PodUID || a.FQDN != b.FQDN || a.DeviceID != b.DeviceID {
		return nil, true
	}
	changed := map[string]bool{}
	for _, n := range a.Advertised {
		if !slices.Contains(b.Advertised, n) {
			changed[n] = true
		}
	}
	for _, n := range b.Advertised {
		if !slices.Contains(a.Advertised, n) {
			changed[n] = true
		}
	}
	for _, name := range unionKeys(a.Certificates, b.Certificates) {
		if a.Certificates[name] != b.Certificates[name] {
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
