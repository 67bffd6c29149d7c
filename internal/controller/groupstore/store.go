package groupstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// Store is the ProxyGroup document store: the documents on each group's ConfigMaps, the
// Tailscale Services they advertise, and what the group's replicas report back. It owns every
// cache laid over the informer cache for them (where each object's entries are, the Tailscale
// Service reads, the decoded documents, the report parses), which live as long as it does; the
// reconcilers hold a Store and never its parts.
type Store interface {
	// ClaimService creates or updates Tailscale Service name with this operator among its
	// owners, for obj (of kind) (ErrNotOurs when someone else's of that name exists).
	ClaimService(ctx context.Context, kind string, obj client.Object, name string, ports, tags []string) (ServiceClaim, error)
	// Put writes e's entry on its group, first moving the object's entries off any other
	// group and releasing what it served, or claimed, under another name. Errors: ErrConfigFull, NotFound
	// while the group has no ConfigMap yet, or tailnet errors from a release.
	Put(ctx context.Context, e Entry) error
	// Withdraw takes the entries of obj (of kind) off every group and releases their
	// Tailscale Services, svcName among them.
	Withdraw(ctx context.Context, kind string, obj client.Object, svcName string) error
	// Holder names the object whose entry serves svcName on a group, as "Kind/namespace/name"
	// ("": none). Objects of different kinds that ask for one name check it: the first keeps it.
	Holder(ctx context.Context, svcName string) (string, error)
	// Layout reads the shard count of group g's documents and, when asked, the services they
	// hold.
	Layout(ctx context.Context, g proxies.Group, listServices bool) (Layout, error)
	// Replicas reads replicas 0..n-1 of group g.
	Replicas(ctx context.Context, g proxies.Group, n int) ([]proxies.Replica, error)
	// States reads what each replica's running Pod reports, by ordinal: nil for a replica
	// without a Pod or whose state is left from an earlier Pod. Shared: do not change them.
	States(ctx context.Context, pg *tsv1alpha1.ProxyGroup) ([]*contract.ProxyState, error)
	// Advertisers counts pg's replicas whose running Pod advertises svcName.
	Advertisers(ctx context.Context, pg *tsv1alpha1.ProxyGroup, svcName string) (Advertising, error)
	// Events maps changes of the groups' objects to the objects of kind they concern (all
	// lists those served on a group); see groupEvents.
	Events(kind string, all func(ctx context.Context, pg string) []reconcile.Request) handler.EventHandler
}

// Entry is one object's document on a group: Web for an Ingress, DNAT for a Service.
type Entry struct {
	Kind    string
	Object  client.Object
	Group   string
	Service string // the Tailscale Service name, svc:<hostname>
	Web     *contract.WebService
	DNAT    *contract.DNATService
}

// Layout is how a group's documents are spread.
type Layout struct {
	Shards   int
	Services []string // only when asked for
}

// Advertising is what a group's replicas report about one service.
type Advertising struct {
	// Replicas advertise it of Total.
	Replicas, Total int
	// Domain is the tailnet's domain, read off the replicas' names.
	Domain string
	// DNATErrors are what replicas that do not advertise it report about its DNAT rules,
	// "<replica>: <error>", by ordinal.
	DNATErrors []string
}

// NewStore returns the store of the ProxyGroup documents in namespace (the operator's): c is
// the cached client, api the uncached reader its writer falls back to after a conflict, tc the
// tailnet's control plane.
func NewStore(c client.Client, api client.Reader, tc tailnet.Client, s kit.Settings) Store {
	return &store{
		client:   c,
		where:    proxies.WhereFor(s),
		docs:     documents{Client: c, Namespace: s.Namespace, W: newGroupWriter(c, api, s.Namespace, s.GroupShardBytes)},
		services: &tailscaleServices{API: api, Tailnet: tc, Settings: s},
	}
}

type store struct {
	client   client.Client
	where    proxies.Where
	docs     documents
	services *tailscaleServices
	reports  proxies.Reports
}

func (s *store) ClaimService(ctx context.Context, kind string, obj client.Object, name string, ports, tags []string) (ServiceClaim, error) {
	return s.services.Ensure(ctx, name, ownerOf(kind, obj), ports, tags)
}

func (s *store) Put(ctx context.Context, e Entry) error {
	owner := ownerOf(e.Kind, e.Object)
	here := placement{UID: e.Object.GetUID(), PG: e.Group, SvcName: e.Service}
	if !s.docs.placedAt(owner, here) {
		if err := s.docs.removeElsewhere(ctx, e.Service, e.Group); err != nil {
			return err
		}
		if err := s.releaseOwned(ctx, owner, e.Service); err != nil {
			return err
		}
		s.docs.place(owner, here)
	}
	if e.DNAT != nil {
		return s.docs.setDNATDoc(ctx, e.Group, e.Service, e.DNAT, owner)
	}
	return s.docs.setServeDoc(ctx, e.Group, e.Service, e.Web, owner)
}

func (s *store) Withdraw(ctx context.Context, kind string, obj client.Object, svcName string) error {
	owner := ownerOf(kind, obj)
	s.docs.unplace(owner)
	if err := s.docs.removeElsewhere(ctx, svcName, ""); err != nil {
		return err
	}
	if err := s.services.Release(ctx, svcName, owner); err != nil {
		return err
	}
	return s.releaseOwned(ctx, owner, "")
}

func (s *store) Holder(ctx context.Context, svcName string) (string, error) {
	cms, err := s.docs.groupConfigMaps(ctx)
	if err != nil {
		return "", err
	}
	for i := range cms {
		if owner := s.docs.W.content(&cms[i]).owners[svcName]; owner != "" {
			return owner, nil
		}
	}
	return "", nil
}

// TakenByOtherKind names the object of another kind than kind whose entry serves svcName on a
// group, as "Kind namespace/name" ("": none). Objects of one kind settle who keeps a name among
// themselves (TakenBy); across kinds the first entry written keeps it, but an Ingress and a
// Service of one name do not hold it from each other, as before Gateways (their documents
// differ: serve and DNAT).
func TakenByOtherKind(ctx context.Context, s Store, kind, svcName string) (string, error) {
	holder, err := s.Holder(ctx, svcName)
	if err != nil {
		return "", fmt.Errorf("reading which object serves %s: %w", svcName, err)
	}
	other, key, _ := strings.Cut(holder, "/")
	ingressAndService := (kind == "Ingress" && other == "Service") || (kind == "Service" && other == "Ingress")
	if holder == "" || other == kind || ingressAndService {
		return "", nil
	}
	return other + " " + key, nil
}

// releaseOwned removes the group entries owner has under any name but keep, and releases their
// Tailscale Services and those claimed for it: what an object served, or was about to serve,
// before it was renamed (or everything, keep "").
func (s *store) releaseOwned(ctx context.Context, owner, keep string) error {
	names, err := s.docs.ownedBy(ctx, owner)
	if err != nil {
		return err
	}
	claimed, err := s.services.claimedBy(ctx, owner)
	if err != nil {
		return err
	}
	names = append(names, claimed...)
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if name == keep {
			continue
		}
		// Released first: the owner index leads here again until the entries are gone.
		if err := s.services.Release(ctx, name, owner); err != nil {
			return err
		}
		if err := s.docs.removeElsewhere(ctx, name, ""); err != nil {
			return err
		}
	}
	return nil
}

func (s *store) Layout(ctx context.Context, g proxies.Group, listServices bool) (Layout, error) {
	ns := s.docs.Namespace
	main := &corev1.ConfigMap{}
	err := s.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: g.ConfigMap()}, main)
	if apierrors.IsNotFound(err) {
		return Layout{Shards: 1}, nil
	}
	if err != nil {
		return Layout{}, fmt.Errorf("reading the ConfigMap %s/%s of ProxyGroup %s: %w", ns, g.ConfigMap(), g.Name, err)
	}
	count, err := contract.ShardCount(contract.ConfigMapBytes(main.Data))
	if err != nil {
		// Its documents are not read either: a reader of this build sees none.
		return Layout{Shards: 1}, nil //nolint:nilerr // a shard count this build cannot read means no documents for it
	}
	if !listServices {
		return Layout{Shards: count}, nil
	}
	shards := []map[string][]byte{contract.ConfigMapBytes(main.Data)}
	for i := 1; i < count; i++ {
		cm := &corev1.ConfigMap{}
		key := client.ObjectKey{Namespace: ns, Name: contract.ShardName(g.ConfigMap(), i)}
		if err := s.client.Get(ctx, key, cm); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return Layout{}, fmt.Errorf("reading the ConfigMap shard %s/%s of ProxyGroup %s: %w", ns, key.Name, g.Name, err)
		}
		shards = append(shards, contract.ConfigMapBytes(cm.Data))
	}
	return Layout{Shards: count, Services: groupServices(shards)}, nil
}

func (s *store) Replicas(ctx context.Context, g proxies.Group, n int) ([]proxies.Replica, error) {
	reps := make([]proxies.Replica, n)
	for i := range n {
		var err error
		if reps[i], err = g.Replicas().Read(ctx, s.client, &s.reports, s.where, i); err != nil {
			return nil, err
		}
	}
	return reps, nil
}

func (s *store) States(ctx context.Context, pg *tsv1alpha1.ProxyGroup) ([]*contract.ProxyState, error) {
	reps, err := s.Replicas(ctx, proxies.Group{Name: pg.Name}, proxies.Replicas(pg))
	if err != nil {
		return nil, err
	}
	states := make([]*contract.ProxyState, max(len(reps), 1))
	for i, r := range reps {
		states[i] = r.State
	}
	return states, nil
}

func (s *store) Advertisers(ctx context.Context, pg *tsv1alpha1.ProxyGroup, svcName string) (Advertising, error) {
	states, err := s.States(ctx, pg)
	if err != nil {
		return Advertising{}, err
	}
	a := Advertising{Total: proxies.Replicas(pg)}
	for i, st := range states {
		if st == nil {
			continue
		}
		if _, d, ok := strings.Cut(st.FQDN, "."); ok {
			a.Domain = d
		}
		if Advertises(st, svcName) {
			a.Replicas++
			continue
		}
		if st.Firewall != nil {
			if m, ok := st.Firewall.Mappings[svcName]; ok && m.Error != "" {
				a.DNATErrors = append(a.DNATErrors, fmt.Sprintf("%s: %s", proxies.Group{Name: pg.Name}.Replicas().StateSecret(i), m.Error))
			}
		}
	}
	return a, nil
}

func (s *store) Events(kind string, all func(ctx context.Context, pg string) []reconcile.Request) handler.EventHandler {
	return groupEvents{C: s.client, Docs: s.docs, Reports: &s.reports, Kind: kind, All: all}.handler()
}
