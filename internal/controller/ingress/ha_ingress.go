package ingress

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// HAIngressReconciler serves Ingresses annotated tailscale.com/proxy-group through a
// ProxyGroup: one Tailscale Service each, in the group's Serve config.
type HAIngressReconciler struct {
	client.Client
	kit.Reporter
	Settings kit.Settings
	store    groupstore.Store
	Certs    certs.CertSecrets
	Guard    *certs.CertGuard
	// TLSSecrets sees users' TLS Secrets change, BackendCAs their ConfigMaps.
	TLSSecrets *kit.NamespaceNameWatch
	BackendCAs *kit.NameWatch
	Info       func(context.Context) tailnet.TailnetInfo
}

func (r *HAIngressReconciler) serves(ing *networkingv1.Ingress) bool {
	return ing.DeletionTimestamp == nil &&
		ing.Spec.IngressClassName != nil && *ing.Spec.IngressClassName == r.Settings.IngressClassName &&
		ing.Annotations[kit.AnnotationProxyGroup] != ""
}

func (r *HAIngressReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return kit.Served[*networkingv1.Ingress]{
		Client: r.Client, Reporter: r.Reporter, Kind: "Ingress",
		New: func() *networkingv1.Ingress { return &networkingv1.Ingress{} }, Serves: r.serves, Serve: r.serve, Unserve: func(ctx context.Context, ing *networkingv1.Ingress) (ctrl.Result, error) {
			return r.unserve(ctx, ing, "svc:"+kit.IngressHostname(ing))
		},
	}.Reconcile(ctx, req)
}

// serve runs a pass over an Ingress this reconciler serves; it adds its finalizer once the
// Ingress is valid.
func (r *HAIngressReconciler) serve(ctx context.Context, ing *networkingv1.Ingress) (_ ctrl.Result, err error) {
	s := &HAIngressScope{Ing: ing, Hostname: kit.IngressHostname(ing)}
	s.svcName = "svc:" + s.Hostname
	// Status is computed from what this pass observed and patched once, at the end.
	defer func() {
		if lb, decided := s.loadBalancer(r.Guard.Now()); decided {
			if perr := setIngressLoadBalancer(ctx, r.Client, ing, lb); perr != nil && err == nil {
				err = fmt.Errorf("writing Ingress status: %w", perr)
			}
		}
	}()
	if err := r.gather(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	d := decideHAIngress(s, r.Settings.DefaultTags)
	r.Findings(ing, d.Findings)
	if kit.HasBlocking(d.Findings) {
		return ctrl.Result{}, nil
	}
	pg, ws := s.Group, &d.WS
	if err := kit.AddFinalizer(ctx, r.Client, ing, groupstore.FinalizerIngressPG); err != nil {
		return ctrl.Result{}, err
	}
	ts, err := r.store.ClaimService(ctx, "Ingress", ing, s.svcName, groupstore.WebPorts(ws), d.Tags)
	if err != nil {
		return groupstore.ClaimFailure(r.Reporter, ing, err)
	}
	if ts.Created {
		r.Created(ing, kit.ReasonTailscaleServiceCreated, "created Tailscale Service %s (%s) for ProxyGroup %s", s.svcName, groupstore.AddrList(ts.Addrs), pg.Name)
	}
	for _, c := range s.byo.Copies {
		// Owned by the group, so that its Role is rebuilt to let replicas read the copy.
		if err := controllerutil.SetControllerReference(pg, c, r.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := kit.Apply(ctx, r.Client, c); err != nil {
			return ctrl.Result{}, err
		}
	}
	// Stale copies of this Ingress, on this group or one it left.
	if err := certs.PruneCertCopies(ctx, r.Client, r.Settings.Namespace, map[string]string{kit.LabelIngress: kit.HashLabel(ing.Namespace + "/" + ing.Name)}, s.byo.Copies); err != nil {
		return ctrl.Result{}, err
	}
	if s.cert, err = r.Certificate(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	certs.CertificateIssued(r.Reporter, ing, s.cert, r.Guard.Now())
	ws.TLS.Hold = s.cert.Hold
	if err := r.store.Put(ctx, groupstore.Entry{Kind: "Ingress", Object: ing, Group: pg.Name, Service: s.svcName, Web: ws}); err != nil {
		return groupstore.PutFailure(r.Reporter, ing, err)
	}
	s.configured = ws
	if _, served := haIngressLoadBalancer(s.svcName, ws, s.cert, s.States, r.Guard.Now()); served {
		r.Progress(ing, "serving", kit.ReasonServing, "serving https://%s through Tailscale Service %s", s.cert.FQDN, s.svcName)
		if ws.Funnel {
			kit.ReportFunnel(r.Reporter, ing, s.cert.FQDN, groupstore.Tags(pg, r.Settings.DefaultTags), s.States)
		}
	}
	return ctrl.Result{RequeueAfter: groupstore.Sooner(s.cert.Recheck(s.byo.Recheck, r.Guard.Now()), ts.Recheck)}, nil
}

// haIngressScope is what a pass over an Ingress on a ProxyGroup reads, and what it configured.
type HAIngressScope struct {
	Ing               *networkingv1.Ingress
	Hostname, svcName string
	// Group is the ProxyGroup named, or nil with groupFinding saying why it cannot serve.
	Group        *tsv1alpha1.ProxyGroup
	groupFinding *kit.Finding
	// takenBy is another object ("Kind namespace/name") that already serves the hostname on a
	// ProxyGroup.
	takenBy string
	domain  string
	routes  RouteInputs
	byo     certs.BYOCertificates
	// States is what the group's replicas report, read once for the certificate and the status.
	States []*contract.ProxyState
	cert   certs.TailnetCert
	// configured is what the group's document serves for the Ingress after this pass; nil
	// leaves the status as it was.
	configured *contract.WebService
}

func (r *HAIngressReconciler) gather(ctx context.Context, s *HAIngressScope) error {
	var err error
	if s.Group, s.groupFinding, err = groupstore.ResolveGroup(ctx, r.Client, s.Ing.Namespace, s.Ing.Annotations[kit.AnnotationProxyGroup]); err != nil {
		return err
	}
	// An invalid hostname is decideIngress's finding; a valid one may be taken.
	if contract.ValidHostname(s.Hostname) {
		if s.takenBy, err = r.hostnameTakenBy(ctx, s.Ing, s.Hostname); err != nil {
			return err
		}
		if s.takenBy != "" {
			s.takenBy = "Ingress " + s.takenBy
		} else if s.takenBy, err = groupstore.TakenByOtherKind(ctx, r.store, "Ingress", s.svcName); err != nil {
			return err
		}
	}
	s.domain = r.Info(ctx).Domain
	if s.routes, err = gatherRouteInputs(ctx, r.Client, r.Certs.API, s.Ing, s.domain); err != nil {
		return err
	}
	s.routes.FunnelDenied = !r.Settings.FunnelAllowed(s.Ing.Namespace)
	if s.Group == nil {
		return nil
	}
	if s.byo, err = r.Certs.Resolve(ctx, s.Ing, s.Group.Name, r.Settings.Namespace, byoLabels(s.Group, s.Ing)); err != nil {
		return err
	}
	s.States, err = r.store.States(ctx, s.Group)
	return err
}

// decideHAIngress decides what an Ingress asks its ProxyGroup to serve, and what stops it.
func decideHAIngress(s *HAIngressScope, defaultTags []string) ingressDecision {
	var findings []kit.Finding
	if s.groupFinding != nil {
		findings = append(findings, *s.groupFinding)
	}
	if s.takenBy != "" {
		findings = append(findings, kit.Blockf(kit.ReasonDuplicateHostname, "%s already serves %s on a ProxyGroup; hostnames must be unique", s.takenBy, s.Hostname))
	}
	d := DecideIngress(s.Ing, s.routes, s.byo, defaultTags)
	d.Findings = append(findings, d.Findings...)
	return d
}

// loadBalancer is the Ingress's status.loadBalancer.ingress once the pass configured its group
// (decided false: leave it as it was), with Funnel's port error.
func (s *HAIngressScope) loadBalancer(now time.Time) (lb []networkingv1.IngressLoadBalancerIngress, decided bool) {
	if s.configured == nil {
		return nil, false
	}
	lb, served := haIngressLoadBalancer(s.svcName, s.configured, s.cert, s.States, now)
	if s.routes.FunnelDenied && wantsFunnel(s.Ing) && served {
		setPortError(lb, s.cert.FQDN, kit.ReasonFunnelNamespaceNotPermitted)
	}
	if s.configured.Funnel && served {
		setFunnelPortError(lb, s.cert.FQDN, s.States)
	}
	return lb, true
}

// byoLabels mark the copies of one Ingress's certificates on a ProxyGroup: the group's labels,
// so that its Role lists them, and the Ingress's, so that they are pruned per Ingress.
func byoLabels(pg *tsv1alpha1.ProxyGroup, ing *networkingv1.Ingress) map[string]string {
	l := proxies.Group{Name: pg.Name}.Labels()
	l[kit.LabelIngress] = kit.HashLabel(ing.Namespace + "/" + ing.Name)
	return l
}

// Certificate decides the certificate of the Ingress's tailnet name on its group.
func (r *HAIngressReconciler) Certificate(ctx context.Context, s *HAIngressScope) (certs.TailnetCert, error) {
	g := groupstore.GroupCert{Client: r.Client, Guard: r.Guard, Namespace: r.Settings.Namespace, DefaultProxyClass: r.Settings.DefaultProxyClass}
	return g.Certificate(ctx, r.Reporter, s.Ing, s.Group, s.Hostname, s.domain, s.States)
}

// hostnameTakenBy returns another HA Ingress that serves hostname and came first.
func (r *HAIngressReconciler) hostnameTakenBy(ctx context.Context, ing *networkingv1.Ingress, hostname string) (string, error) {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list, client.MatchingFields{groupstore.IndexIngressHostname: hostname}); err != nil {
		return "", fmt.Errorf("listing the Ingresses that ask for hostname %s: %w", hostname, err)
	}
	others := make([]*networkingv1.Ingress, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return groupstore.TakenBy(ing, others, func(o *networkingv1.Ingress) bool { return r.serves(o) && kit.IngressHostname(o) == hostname }, groupstore.FinalizerIngressPG), nil
}

// haIngressLoadBalancer is an Ingress's status.loadBalancer.ingress, which the reconciler owns
// while it serves the Ingress: the Tailscale Service's name once a replica advertises it (or,
// with a port error, why its certificate is missing) and the bring-your-own hosts served.
// served says whether the tailnet name is served.
func haIngressLoadBalancer(svcName string, ws *contract.WebService, cert certs.TailnetCert, states []*contract.ProxyState, now time.Time) (lb []networkingv1.IngressLoadBalancerIngress, served bool) {
	advertising := groupstore.FirstAdvertising(states, svcName)
	if errReason := certs.CertPortError(cert.Hold, cert.Cur, now); errReason != "" && cert.FQDN != "" {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: cert.FQDN,
			Ports: []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP, Error: &errReason}}})
	} else if advertising != nil && cert.FQDN != "" {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: cert.FQDN, Ports: httpsPorts(ws.HTTP != contract.HTTPOff)})
		served = true
	}
	if advertising != nil {
		lb = append(lb, byoStatus(ws.TLS.Certificates, advertising.Certificates, now)...)
	}
	return lb, served
}

// unserve removes an Ingress's entry from every group and releases its Tailscale Service.
func (r *HAIngressReconciler) unserve(ctx context.Context, ing *networkingv1.Ingress, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ing, groupstore.FinalizerIngressPG) {
		r.Forget(client.ObjectKeyFromObject(ing))
		return ctrl.Result{}, nil
	}
	if err := r.store.Withdraw(ctx, "Ingress", ing, svcName); err != nil {
		return r.TailnetFailure(ing, err)
	}
	// Its certificate copies on whichever group it was on.
	byo := map[string]string{kit.LabelIngress: kit.HashLabel(ing.Namespace + "/" + ing.Name)}
	if err := certs.PruneCertCopies(ctx, r.Client, r.Settings.Namespace, byo, nil); err != nil {
		return ctrl.Result{}, err
	}
	return kit.Unserved(ctx, r.Client, r.Reporter, ing, groupstore.FinalizerIngressPG, func(ctx context.Context) error {
		return setIngressLoadBalancer(ctx, r.Client, ing, nil)
	})
}

// SetupWithManager watches Ingresses, backend Services, ProxyGroups and their state Secrets.
func (r *HAIngressReconciler) SetupWithManager(mgr ctrl.Manager, store groupstore.Store) error {
	r.store = store
	group := store.Events("Ingress", r.onGroup)
	return ctrl.NewControllerManagedBy(mgr).
		For(&networkingv1.Ingress{}, builder.WithPredicates(groupstore.OwnWrites(groupstore.FinalizerIngressPG))).
		Named("ingress-proxygroup").
		WithOptions(groupstore.HAControllerOptions).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			list := &networkingv1.IngressList{}
			if err := r.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressBackends: o.GetName()}); err != nil {
				return nil
			}
			return ingressRequests(list.Items, r.serves)
		})).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(ingressesForEndpointSlice(r.Client, r.serves))).
		Watches(&tsv1alpha1.ProxyGroup{}, group).
		Watches(&corev1.Secret{}, group).
		WatchesRawSource(r.TLSSecrets.Source(ingressesForTLSSecret(r.Client, r.serves))).
		WatchesRawSource(r.BackendCAs.Source(ingressesForBackendCA(r.Client, r.serves))).
		Watches(&corev1.ConfigMap{}, group).
		Watches(&tsv1alpha1.ProxyGroupPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			// A change of its namespace's policies may let an Ingress on a group or keep it from it.
			return r.served(ctx, client.InNamespace(o.GetNamespace()))
		})).
		Complete(r)
}

// onGroup lists the Ingresses served on a ProxyGroup.
func (r *HAIngressReconciler) onGroup(ctx context.Context, name string) []reconcile.Request {
	return r.served(ctx, client.MatchingFields{groupstore.IndexIngressGroup: name})
}

// served lists the Ingresses that opts select and this reconciler serves.
func (r *HAIngressReconciler) served(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		return nil
	}
	return ingressRequests(list.Items, r.serves)
}
