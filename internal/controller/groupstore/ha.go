package groupstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// Finalizers of objects served by a ProxyGroup (the original operator's names).
const (
	FinalizerIngressPG = "tailscale.com/ingress-pg-finalizer"
	FinalizerServicePG = "tailscale.com/service-pg-finalizer"
	FinalizerGatewayPG = "tailscale.com/gateway-pg-finalizer"
)

const (
	AnnotationOwnerRefs = "tailscale.com/owner-references"
	serviceComment      = "managed by the tsingress operator; do not modify"
	// maxShardBytes bounds the documents in one group ConfigMap: more go to more shards.
	maxShardBytes = 128 << 10
)

// groupDocs reads and writes the documents of ProxyGroup ConfigMaps. Writes go through the
// group's writer, which batches the changes of concurrent reconcilers (ha_docs.go).
type documents struct {
	client.Client
	Namespace string
	W         *groupWriter
}

// groupConfigMaps lists the group ConfigMaps from the cache, shared: read them, never change
// them.
func (d documents) groupConfigMaps(ctx context.Context) ([]corev1.ConfigMap, error) {
	list := &corev1.ConfigMapList{}
	if err := d.List(ctx, list, client.InNamespace(d.Namespace), client.UnsafeDisableDeepCopy,
		client.MatchingLabels{kit.LabelManaged: "true", kit.LabelParentType: proxies.ParentTypeProxyGroup}); err != nil {
		return nil, fmt.Errorf("listing the ProxyGroup ConfigMaps in %s: %w", d.Namespace, err)
	}
	return list.Items, nil
}

// ownersKey holds, in a group ConfigMap, which object each entry was written for
// ("Ingress/ns/name"), so that an object that changes its name finds its old entry.
const ownersKey = "owners.json"

func owners(cm *corev1.ConfigMap) map[string]string {
	o := map[string]string{}
	_ = json.Unmarshal([]byte(cm.Data[ownersKey]), &o) // a damaged index only loses old entries
	return o
}

// ownedBy lists the Tailscale Services whose group entries were written for owner.
func (d documents) ownedBy(ctx context.Context, owner string) ([]string, error) {
	cms, err := d.groupConfigMaps(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for i := range cms {
		names = append(names, d.W.content(&cms[i]).owned(owner)...)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// placement is where an object's group entries are: on group pg, under svcName. The object is
// known by its UID, so that one deleted and created again under its name starts afresh.
type placement struct {
	UID         types.UID
	PG, SvcName string
}

// placedAt reports whether an earlier pass of owner in this process left its entries at p
// alone (removeElsewhere and releaseOwned done). Only this operator writes the entries of its
// objects, so until the object moves or is renamed, nothing can have gone elsewhere since: its
// later passes skip both, which read every group's documents.
func (d documents) placedAt(owner string, p placement) bool {
	v, ok := d.W.placed.Load(owner)
	return ok && v.(placement) == p
}

// place records that owner's entries are at p alone.
func (d documents) place(owner string, p placement) { d.W.placed.Store(owner, p) }

// unplace forgets where owner's entries are: it is leaving its group.
func (d documents) unplace(owner string) { d.W.placed.LoadAndDelete(owner) }

func hasService[V any](services map[string]V, name string) bool {
	_, ok := services[name]
	return ok
}

func ownerOf(kind string, obj client.Object) string {
	return kind + "/" + obj.GetNamespace() + "/" + obj.GetName()
}

// setServe sets (or, with ws nil, removes) one service's entry in a group's Serve config.
func (d documents) setServeDoc(ctx context.Context, pg, svcName string, ws *contract.WebService, owner string) error {
	if ws != nil && d.W.holds(ctx, pg, svcName, func(g *groupContent) bool {
		cur, ok := g.serve.Services[svcName]
		return ok && g.owners[svcName] == owner && sameJSON(cur, *ws)
	}) {
		return nil
	}
	return d.W.change(ctx, pg, func(g *groupShards) { g.setServe(svcName, ws, owner) })
}

// setDNAT sets (or, with m nil, removes) one service's entry in a group's DNAT mappings.
func (d documents) setDNATDoc(ctx context.Context, pg, svcName string, m *contract.DNATService, owner string) error {
	if m != nil && d.W.holds(ctx, pg, svcName, func(g *groupContent) bool {
		cur, ok := g.dnat.Services[svcName]
		return ok && g.owners[svcName] == owner && sameJSON(cur, *m)
	}) {
		return nil
	}
	return d.W.change(ctx, pg, func(g *groupShards) { g.setDNAT(svcName, m, owner) })
}

// sameJSON reports whether two entries are written the same: one decoded from a document and
// one built by a reconciler may differ in empty fields that encode alike.
func sameJSON[V any](a, b V) bool {
	x, errA := json.Marshal(a)
	y, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// ErrConfigFull says a group's documents would outgrow its ConfigMaps.
var ErrConfigFull = fmt.Errorf("the ProxyGroup's configuration would exceed %d ConfigMaps of %d KiB; spread objects over more ProxyGroups", contract.MaxShards, maxShardBytes>>10)

// removeElsewhere removes svcName from the documents of every group but keep, so an object
// that moved to another group, or left groups, is served only where it is now.
func (d documents) removeElsewhere(ctx context.Context, svcName, keep string) error {
	cms, err := d.groupConfigMaps(ctx)
	if err != nil {
		return err
	}
	for i := range cms {
		pg := cms[i].Labels[kit.LabelParentName]
		if pg == keep || !d.W.content(&cms[i]).has(svcName) {
			continue
		}
		if err := d.W.change(ctx, pg, func(g *groupShards) {
			g.setServe(svcName, nil, "")
			g.setDNAT(svcName, nil, "")
		}); err != nil {
			return fmt.Errorf("removing %s from the documents of ProxyGroup %s: %w", svcName, pg, err)
		}
	}
	return nil
}

// ResolveGroup finds the ProxyGroup an object of namespace names, or a finding saying why it
// cannot serve: it does not exist, is not of type ingress, or the namespace's ProxyGroupPolicies
// do not let its objects use it.
func ResolveGroup(ctx context.Context, c client.Client, namespace, name string) (*tsv1alpha1.ProxyGroup, *kit.Finding, error) {
	// The policy first: a namespace kept from a group learns nothing of it.
	if allowed, limited, err := PermittedGroups(ctx, c, namespace); err != nil {
		return nil, nil, err
	} else if limited && !slices.Contains(allowed, name) {
		f := kit.Blockf(kit.ReasonProxyGroupNotPermitted, "ProxyGroup %q is not among those the ProxyGroupPolicies of namespace %s let its Ingresses and Services use: %s "+
			"(what the group already served for the object is left as it was)", name, namespace, strings.Join(allowed, ", "))
		if len(allowed) == 0 {
			f.Message = fmt.Sprintf("the ProxyGroupPolicies of namespace %s let its Ingresses and Services use no ProxyGroup "+
				"(what a group already served for the object is left as it was)", namespace)
		}
		return nil, &f, nil
	}
	pg := &tsv1alpha1.ProxyGroup{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, pg); err != nil {
		if apierrors.IsNotFound(err) {
			f := kit.Blockf(kit.ReasonProxyGroupNotFound, "ProxyGroup %q does not exist", name)
			return nil, &f, nil
		}
		return nil, nil, fmt.Errorf("reading ProxyGroup %s: %w", name, err)
	}
	if pg.Spec.Type != tsv1alpha1.ProxyGroupTypeIngress {
		f := kit.Blockf(kit.ReasonProxyGroupWrongType, "ProxyGroup %q is of type %s; only ingress ProxyGroups serve Ingresses and Services", name, pg.Spec.Type)
		return nil, &f, nil
	}
	return pg, nil, nil
}

// OwnerRefs is the ownership annotation of a Tailscale Service: the operators (clusters) that
// use it. Several may share one service for multi-cluster HA; it is deleted with its last owner.
type OwnerRefs struct {
	OwnerRefs []ownerRef `json:"ownerRefs"`
}

type ownerRef struct {
	OperatorID string `json:"operatorID"`
	// Ports and Tags are what the owner's object asks of the service. The service gets the
	// union over its owners, so that clusters whose objects differ do not overwrite each other
	// in turn, and an owner that leaves takes its own away.
	Ports []string `json:"ports,omitempty"`
	Tags  []string `json:"tags,omitempty"`
	// Object is the object of the owner's cluster that serves under the name (see ownerOf):
	// written with the claim itself, so that a name claimed and never entered on a group (the
	// object renamed, or the operator stopped, in between) is still found and released.
	Object string `json:"object,omitempty"`
}

// union is the ports and tags the owners ask for, sorted. An owner whose record says neither
// (written by another implementation) keeps what the service has.
func (refs OwnerRefs) union(existing tailnet.Service) (ports, tags []string) {
	for _, r := range refs.OwnerRefs {
		if r.Ports == nil && r.Tags == nil {
			ports, tags = append(ports, existing.Ports...), append(tags, existing.Tags...)
			continue
		}
		ports, tags = append(ports, r.Ports...), append(tags, r.Tags...)
	}
	slices.Sort(ports)
	slices.Sort(tags)
	return slices.Compact(ports), slices.Compact(tags)
}

// The operator reads its own namespace, by name, and no other. A Role in that namespace grants
// it: the API server takes a request for the Namespace object itself as one in that namespace.
// +kubebuilder:rbac:groups="",namespace=system,resources=namespaces,verbs=get

// tailscaleServices creates, shares and releases Tailscale Services on behalf of one operator.
type tailscaleServices struct {
	// API reads the operator's namespace: uncached, as a cache would list and watch them all.
	API      client.Reader
	Tailnet  tailnet.Client
	Settings kit.Settings

	// id is this operator's ID once read; a failed read is tried again at the next call.
	idMu sync.Mutex
	id   string

	// read remembers, by service name, the last read that found a service as this operator
	// wants it (readService), and now is the clock it is dated by (time.Now when nil).
	read sync.Map
	now  func() time.Time

	// claims maps each service this operator owns to the object it claimed it for: read from
	// the tailnet once (what an earlier operator Pod claimed), then kept with every claim and
	// release.
	claimsMu     sync.Mutex
	claims       map[string]string
	claimsLoaded bool
}

// readService is a read of a Tailscale Service that found this operator's record as wanted.
type readService struct {
	svc                tailnet.Service
	owner, ports, tags string // what this operator asked for, joined
	at                 time.Time
}

// serviceReadReuse is how long such a read stands in for another: a burst of reconciles (a
// group's report changes the status of every object it serves) costs one read per service
// instead of one per reconcile. A change made elsewhere is seen within it, at the next
// reconcile, or at the ownership check (sharedResync, when shorter).
const serviceReadReuse = time.Minute

func (t *tailscaleServices) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// recentRead returns the read of name to reuse for what this operator asks now, if any.
func (t *tailscaleServices) recentRead(name, owner, ports, tags string) (tailnet.Service, bool) {
	v, ok := t.read.Load(name)
	if !ok {
		return tailnet.Service{}, false
	}
	r := v.(readService)
	fresh := t.clock().Before(r.at.Add(min(serviceReadReuse, t.sharedResync())))
	return r.svc, fresh && r.owner == owner && r.ports == ports && r.tags == tags
}

// recordClaim notes that owner claims name, before the write that claims it.
func (t *tailscaleServices) recordClaim(name, owner string) {
	t.claimsMu.Lock()
	defer t.claimsMu.Unlock()
	if t.claims == nil {
		t.claims = map[string]string{}
	}
	t.claims[name] = owner
}

// forgetClaim forgets owner's claim of name, if the claim is still owner's.
func (t *tailscaleServices) forgetClaim(name, owner string) {
	t.claimsMu.Lock()
	defer t.claimsMu.Unlock()
	if t.claims[name] == owner {
		delete(t.claims, name)
	}
}

// claimedBy lists the services this operator claimed for owner, in this Pod or an earlier one.
func (t *tailscaleServices) claimedBy(ctx context.Context, owner string) ([]string, error) {
	if err := t.loadClaims(ctx); err != nil {
		return nil, err
	}
	t.claimsMu.Lock()
	defer t.claimsMu.Unlock()
	var names []string
	for name, o := range t.claims {
		if o == owner {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// loadClaims reads, once, the claims this operator's records on the tailnet name. Claims made
// in this Pod meanwhile are newer and stand.
func (t *tailscaleServices) loadClaims(ctx context.Context) error {
	t.claimsMu.Lock()
	loaded := t.claimsLoaded
	t.claimsMu.Unlock()
	if loaded {
		return nil
	}
	id, err := t.operatorID(ctx)
	if err != nil {
		return err
	}
	all, err := t.Tailnet.Services(ctx)
	if err != nil {
		return fmt.Errorf("listing Tailscale Services to find those this operator claimed: %w", err)
	}
	t.claimsMu.Lock()
	defer t.claimsMu.Unlock()
	if t.claims == nil {
		t.claims = map[string]string{}
	}
	for _, svc := range all {
		if ref, ok := ourRef(svc, id); ok && ref.Object != "" {
			if _, known := t.claims[svc.Name]; !known {
				t.claims[svc.Name] = ref.Object
			}
		}
	}
	t.claimsLoaded = true
	log.FromContext(ctx).Info("read the Tailscale Services this operator claimed", "services", len(all), "claimed", len(t.claims))
	return nil
}

// ourRef is operator id's record on svc, if any.
func ourRef(svc tailnet.Service, id string) (ownerRef, bool) {
	var refs OwnerRefs
	if json.Unmarshal([]byte(svc.Annotations[AnnotationOwnerRefs]), &refs) != nil {
		return ownerRef{}, false
	}
	i := slices.IndexFunc(refs.OwnerRefs, func(r ownerRef) bool { return r.OperatorID == id })
	if i < 0 {
		return ownerRef{}, false
	}
	return refs.OwnerRefs[i], true
}

// operatorID identifies this operator installation among the owners of a Tailscale Service:
// the UID of its namespace, stable for the life of the installation.
func (t *tailscaleServices) operatorID(ctx context.Context) (string, error) {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	if t.id != "" {
		return t.id, nil
	}
	ns := &corev1.Namespace{}
	if err := t.API.Get(ctx, client.ObjectKey{Name: t.Settings.Namespace}, ns); err != nil {
		return "", fmt.Errorf("reading the operator's namespace %s, whose UID identifies it: %w", t.Settings.Namespace, err)
	}
	t.id = string(ns.UID)
	return t.id, nil
}

// ErrNotOurs says a Tailscale Service of that name exists and belongs to someone else.
type ErrNotOurs struct{ name string }

func (e ErrNotOurs) Error() string {
	return fmt.Sprintf("Tailscale Service %s already exists and is not managed by this operator; delete it or choose another hostname", e.name)
}

// ServiceClaim is a Tailscale Service as ensure left it.
type ServiceClaim struct {
	tailnet.Service
	Created bool
	// Recheck is when to run ensure again without a watch event: soon after a write, and now
	// and then after that, as other operators may own the service too.
	Recheck time.Duration
}

// Ownership checks. The API has no conditional writes: when two operators write a service at
// once, each from its own read, the second write drops the first one's record. Such a write
// comes within about an API round trip of the first, so the writer reads the service again a
// little later (ownershipVerify) and records itself again if it has to; and every operator
// checks its record now and then (Settings.SharedServiceResync,
// every 5 to 10 minutes by default, as the original operator does), which restores whatever
// slipped through before another owner's release would delete the service.
const (
	ownershipVerify     = 2 * time.Second
	defaultSharedResync = 5 * time.Minute
)

func (t *tailscaleServices) sharedResync() time.Duration {
	return cmp.Or(t.Settings.SharedServiceResync, defaultSharedResync)
}

// jitter spreads rechecks over [d, 2d), so that operators do not write in step.
func jitter(d time.Duration) time.Duration { return d + rand.N(d) }

// Ensure creates or updates the Tailscale Service, with this operator among its owners, for
// object owner.
func (t *tailscaleServices) Ensure(ctx context.Context, name, owner string, ports, tags []string) (ServiceClaim, error) {
	id, err := t.operatorID(ctx)
	if err != nil {
		return ServiceClaim{}, err
	}
	mine := ownerRef{OperatorID: id, Ports: slices.Sorted(slices.Values(ports)), Tags: slices.Sorted(slices.Values(tags)), Object: owner}
	asked, askedTags := strings.Join(mine.Ports, ","), strings.Join(mine.Tags, ",")
	if svc, ok := t.recentRead(name, owner, asked, askedTags); ok {
		return ServiceClaim{Service: svc, Recheck: jitter(t.sharedResync())}, nil
	}
	// Forgotten until read again: a write below, or a failure, leaves it unknown.
	t.read.LoadAndDelete(name)
	refs := OwnerRefs{}
	at := t.clock()
	existing, err := t.Tailnet.Service(ctx, name)
	switch {
	case err == nil:
		raw, ok := existing.Annotations[AnnotationOwnerRefs]
		if !ok || json.Unmarshal([]byte(raw), &refs) != nil {
			return ServiceClaim{}, ErrNotOurs{name}
		}
	case !tailnet.IsNotFound(err):
		return ServiceClaim{}, err
	}
	created := err != nil
	if i := slices.IndexFunc(refs.OwnerRefs, func(r ownerRef) bool { return r.OperatorID == id }); i >= 0 {
		refs.OwnerRefs[i] = mine
	} else {
		refs.OwnerRefs = append(refs.OwnerRefs, mine)
	}
	ports, tags = refs.union(existing)
	raw, _ := json.Marshal(refs)
	want := tailnet.Service{
		Name: name, Ports: ports, Tags: tags, Comment: serviceComment, Addrs: existing.Addrs,
		Annotations: map[string]string{AnnotationOwnerRefs: string(raw)},
	}
	if !created && slices.Equal(existing.Ports, ports) && slices.Equal(existing.Tags, tags) &&
		existing.Annotations[AnnotationOwnerRefs] == string(raw) && len(existing.Addrs) > 0 {
		// Rechecked even while the only owner: another cluster may have joined since, and that
		// join is no event here.
		t.recordClaim(name, owner)
		t.read.Store(name, readService{svc: existing, owner: owner, ports: asked, tags: askedTags, at: at})
		return ServiceClaim{Service: existing, Recheck: jitter(t.sharedResync())}, nil
	}
	// Noted before the write: a write that fails may still have been made.
	t.recordClaim(name, owner)
	svc, err := t.Tailnet.PutService(ctx, want)
	if err != nil {
		return ServiceClaim{Service: svc}, err
	}
	log.FromContext(ctx).Info("put Tailscale Service", "service", name, "created", created, "ports", ports, "tags", tags,
		"addrs", svc.Addrs, "owners", len(refs.OwnerRefs))
	return ServiceClaim{Service: svc, Created: created, Recheck: jitter(ownershipVerify)}, nil
}

// Sooner is the earlier of two rechecks, 0 meaning none.
func Sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// Release drops this operator's ownership of name for object owner, deleting the service when
// no owner is left. A record that names another object of this cluster stays: that object
// claimed the name since.
func (t *tailscaleServices) Release(ctx context.Context, name, owner string) error {
	id, err := t.operatorID(ctx)
	if err != nil {
		return err
	}
	t.read.LoadAndDelete(name)
	existing, err := t.Tailnet.Service(ctx, name)
	if tailnet.IsNotFound(err) {
		t.forgetClaim(name, owner)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Tailscale Service %s to release it: %w", name, err)
	}
	var refs OwnerRefs
	if err := json.Unmarshal([]byte(existing.Annotations[AnnotationOwnerRefs]), &refs); err != nil {
		return nil //nolint:nilerr // owner records we cannot read are not ours: leave the service alone
	}
	i := slices.IndexFunc(refs.OwnerRefs, func(r ownerRef) bool { return r.OperatorID == id })
	switch {
	case i < 0:
		t.forgetClaim(name, owner)
		return nil // released before, or never ours
	case refs.OwnerRefs[i].Object != "" && refs.OwnerRefs[i].Object != owner:
		return nil
	}
	rest := slices.Delete(slices.Clone(refs.OwnerRefs), i, i+1)
	// Deleted with its last owner. Another operator claiming it at this very moment may lose
	// it; it creates it again at its next check (sharedResync, or any change of its object).
	if len(rest) == 0 {
		if err := t.Tailnet.DeleteService(ctx, name); err != nil {
			return fmt.Errorf("deleting Tailscale Service %s, which has no other owner: %w", name, err)
		}
		t.forgetClaim(name, owner)
		log.FromContext(ctx).Info("deleted Tailscale Service", "service", name, "object", owner)
		return nil
	}
	refs.OwnerRefs = rest
	raw, _ := json.Marshal(refs)
	existing.Annotations[AnnotationOwnerRefs] = string(raw)
	existing.Ports, existing.Tags = refs.union(existing)
	if _, err := t.Tailnet.PutService(ctx, existing); err != nil {
		return fmt.Errorf("releasing Tailscale Service %s to its other owners: %w", name, err)
	}
	t.forgetClaim(name, owner)
	log.FromContext(ctx).Info("released Tailscale Service to its other owners", "service", name, "owners", len(rest))
	return nil
}

// Advertises reports whether a parsed report lists svcName: its list is sorted, and large
// groups look up every one of their services in it.
func Advertises(st *contract.ProxyState, svcName string) bool {
	_, found := slices.BinarySearch(st.Advertised, svcName)
	return found
}

// VipsFor picks, per family, the VIPs a Service's destination can be reached from.
func VipsFor(addrs []netip.Addr, dest contract.Destination) []string {
	var has4, has6 bool
	for _, ip := range dest.IPs {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			continue
		}
		has4, has6 = has4 || a.Is4(), has6 || a.Is6()
	}
	var out []string
	for _, a := range addrs {
		// A DNS destination may resolve to either family.
		if dest.DNSName != "" || (a.Is4() && has4) || (a.Is6() && has6) {
			out = append(out, a.String())
		}
	}
	return out
}

// firstServed reports whether a, rather than b, keeps a hostname both ask for: the one already
// served (holding the finalizer), else the older, so the winner does not flip between passes.
func firstServed(a, b client.Object, finalizer string) bool {
	aServed, bServed := controllerutil.ContainsFinalizer(a, finalizer), controllerutil.ContainsFinalizer(b, finalizer)
	if aServed != bServed {
		return aServed
	}
	at, bt := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	if !at.Equal(&bt) {
		return at.Before(&bt)
	}
	return a.GetUID() < b.GetUID()
}

// TakenBy returns the first of others, besides self, that claims the same name and keeps it.
func TakenBy[T client.Object](self T, others []T, sameName func(T) bool, finalizer string) string {
	for _, o := range others {
		if o.GetUID() != self.GetUID() && sameName(o) && firstServed(o, self, finalizer) {
			return o.GetNamespace() + "/" + o.GetName()
		}
	}
	return ""
}

// PutFailure reports an entry that cannot be put on its group (Store.Put).
func PutFailure(r kit.Reporter, obj client.Object, err error) (ctrl.Result, error) {
	if errors.Is(err, ErrConfigFull) {
		r.Warning(obj, kit.ReasonConfigMapFull, "%v", err)
		return ctrl.Result{}, nil
	}
	if apierrors.IsNotFound(err) {
		// The ProxyGroup has not created its ConfigMap yet; its creation brings us back.
		return ctrl.Result{}, nil
	}
	return r.TailnetFailure(obj, err) // releasing what it served under another name
}

// ClaimFailure reports a failed ClaimService for obj: a Tailscale Service of its name that is
// someone else's is a Warning and waits for a change, anything else a tailnet failure.
func ClaimFailure(r kit.Reporter, obj client.Object, err error) (ctrl.Result, error) {
	var notOurs ErrNotOurs
	if errors.As(err, &notOurs) {
		r.Warning(obj, kit.ReasonInvalidTailscaleSvc, "%v", err)
		return ctrl.Result{}, nil
	}
	return r.TailnetFailure(obj, err)
}

// WebPorts are the ports of the Tailscale Service of a web service: those it listens on.
func WebPorts(ws *contract.WebService) []string {
	var out []string
	for _, p := range ws.ListenPorts() {
		out = append(out, fmt.Sprintf("tcp:%d", p))
	}
	return out
}

// AddrList formats a Tailscale Service's addresses for a message.
func AddrList(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// groupOf names the ProxyGroup of a ProxyGroup object or of one of its children.
func groupOf(o client.Object) string {
	if _, ok := o.(*tsv1alpha1.ProxyGroup); ok {
		return o.GetName()
	}
	l := o.GetLabels()
	if l[kit.LabelManaged] == "true" && l[kit.LabelParentType] == proxies.ParentTypeProxyGroup {
		return l[kit.LabelParentName]
	}
	return ""
}

// +kubebuilder:rbac:groups=tailscale.com,resources=proxygrouppolicies,verbs=get;list;watch

// PermittedGroups lists, sorted, the ProxyGroups the ProxyGroupPolicies of a namespace let its
// Ingresses and exposed Services use (the union of their spec.ingress); limited is false while
// the namespace has none, and every group may be used.
func PermittedGroups(ctx context.Context, c client.Client, namespace string) (allowed []string, limited bool, err error) {
	policies := &tsv1alpha1.ProxyGroupPolicyList{}
	if err := c.List(ctx, policies, client.InNamespace(namespace)); err != nil {
		return nil, false, fmt.Errorf("listing the ProxyGroupPolicies of namespace %s: %w", namespace, err)
	}
	for _, p := range policies.Items {
		allowed = append(allowed, p.Spec.Ingress...)
	}
	slices.Sort(allowed)
	return slices.Compact(allowed), len(policies.Items) > 0, nil
}
