package gateway

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// Serving is what the Gateway and HTTPRoute reconcilers share with the Ingress reconcilers:
// the standalone proxies, the ProxyGroups' documents and the certificate guard, whose ledger is
// the operator's.
type Serving struct {
	Settings kit.Settings
	Proxies  *proxies.Proxies
	Groups   groupstore.Store
	Guard    *certs.CertGuard
	// Certs reads the Secrets of listeners' certificateRefs, and TLSSecrets sees them change.
	Certs      certs.CertSecrets
	TLSSecrets *kit.NamespaceNameWatch
	// Gateways, Routes and GRPCRoutes report for the reconcilers of Gateways, HTTPRoutes and
	// GRPCRoutes.
	Gateways, Routes, GRPCRoutes kit.Reporter
}

// common is what both reconcilers read Gateways with.
type common struct {
	client.Client
	*Serving
}

// GatewayReconciler serves the Gateways of a class of this operator, with the routes of the
// HTTPRoutes attached to them, through a standalone proxy each or, annotated
// tailscale.com/proxy-group, as a Tailscale Service of a ProxyGroup. The HTTPRoute reconciler
// decides the same attachments (the same pure functions) for the routes' status: one writer
// per object, as a route may name several Gateways.
type GatewayReconciler struct {
	common
	kit.Reporter
}

// Gateways are served (a finalizer, so their proxy is removed first) and their status written.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gateways,verbs=list;watch;patch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gateways/status,verbs=patch
// The routes attached to them, read; the route reconcilers write their status.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes;grpcroutes,verbs=list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes/status;grpcroutes/status,verbs=patch
// The grants that let a route refer to a Service of another namespace.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=referencegrants,verbs=list;watch

func (r *GatewayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return kit.Served[*gatewayv1.Gateway]{
		// The finalizer is the standalone proxy's or the group entry's, added by each path.
		Client: r.Client, Reporter: r.Reporter, Kind: "Gateway",
		New: func() *gatewayv1.Gateway { return &gatewayv1.Gateway{} },
		// A class that cannot be read is taken as ours: only its absence unserves a Gateway.
		Serves: func(gw *gatewayv1.Gateway) bool {
			ok, err := r.ours(ctx, gw)
			return gw.DeletionTimestamp == nil && (ok || err != nil)
		},
		Serve:   r.serve,
		Unserve: r.unserve,
	}.Reconcile(ctx, req)
}

// ours reports whether a Gateway's class is this operator's.
func (c common) ours(ctx context.Context, gw *gatewayv1.Gateway) (bool, error) {
	gc := &gatewayv1.GatewayClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: string(gw.Spec.GatewayClassName)}, gc); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading GatewayClass %s: %w", gw.Spec.GatewayClassName, err)
	}
	return gc.Spec.ControllerName == ControllerName, nil
}

// gatewayInputs is what a Gateway's view is decided from.
type gatewayInputs struct {
	class         *tsv1alpha1.ProxyClass
	classNotReady string
	domain        string
	// certsOff: the tailnet has HTTPS (or MagicDNS) off, so no certificate can be issued.
	certsOff bool
	// state is what a standalone proxy reports.
	state      *contract.ProxyState
	unreadable *kit.Finding
	// onGroup: the Gateway names a ProxyGroup. group is it, or nil with groupFinding saying why
	// it cannot serve; states are what its replicas report, by ordinal.
	onGroup      bool
	group        *tsv1alpha1.ProxyGroup
	groupFinding *kit.Finding
	states       []*contract.ProxyState
	// takenBy is another object ("Kind namespace/name") that serves the hostname on a group.
	takenBy string
	// classIgnored says why the GatewayClass's ProxyClass does not apply ("": it does).
	classIgnored string
	// routes are those naming the Gateway, oldest first (the spec's precedence between routes);
	// routeKind is the kind of the oldest, routeKindOf that route.
	routes      []gatewayv1.HTTPRoute
	routeKind   gatewayv1.Kind
	routeKindOf string
}

// gatherGateway reads what a Gateway's view is decided from: the tailnet's domain and, for a
// standalone proxy, its ProxyClass (its class's parametersRef, else the operator's default) and
// what it reports; for a Gateway on a ProxyGroup, the group, what its replicas report and who
// else serves the hostname.
func (c common) gatherGateway(ctx context.Context, gw *gatewayv1.Gateway) (gatewayInputs, error) {
	var in gatewayInputs
	gc := &gatewayv1.GatewayClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: string(gw.Spec.GatewayClassName)}, gc); err != nil {
		return in, fmt.Errorf("reading GatewayClass %s: %w", gw.Spec.GatewayClassName, err)
	}
	info := c.Proxies.TailnetInfo(ctx)
	in.domain, in.certsOff = info.Domain, !info.CertsAvailable()
	var err error
	if in.routes, err = listRoutes(ctx, c.Client, client.MatchingFields{indexRouteParents: client.ObjectKeyFromObject(gw).String()}); err != nil {
		return in, fmt.Errorf("listing the routes of Gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	slices.SortFunc(in.routes, olderRoute)
	if len(in.routes) > 0 {
		oldest := &in.routes[0]
		in.routeKind, in.routeKindOf = routeKind(oldest), oldest.Namespace+"/"+oldest.Name
	}
	if pg := gw.Annotations[kit.AnnotationProxyGroup]; pg != "" {
		in.onGroup = true
		if gc.Spec.ParametersRef != nil {
			in.classIgnored = fmt.Sprintf("the parametersRef of GatewayClass %s does not apply to a Gateway on ProxyGroup %s: its replicas run with the group's ProxyClass", gc.Name, pg)
		}
		return in, c.gatherGroup(ctx, gw, pg, &in)
	}
	name := c.Settings.DefaultProxyClass
	if ref := gc.Spec.ParametersRef; ref != nil {
		name = ref.Name
		if string(ref.Group) != tsv1alpha1.GroupVersion.Group || string(ref.Kind) != proxyClassKind || ref.Namespace != nil {
			in.classNotReady = fmt.Sprintf("the parametersRef of GatewayClass %s is not a ProxyClass", gc.Name)
		}
	}
	if in.classNotReady == "" {
		class, err := proxies.ResolveProxyClassNamed(ctx, c.Client, name)
		if err != nil {
			return in, err
		}
		in.class, in.classNotReady = class.Ready(), class.NotReady
	}
	in.state, _, in.unreadable, err = c.Proxies.State(ctx, proxies.ParentOf(proxies.ParentTypeGateway, gw))
	return in, err
}

// gatherGroup reads the ProxyGroup a Gateway names, what its replicas report, and whether
// another Gateway, or an object of another kind, serves the Gateway's hostname on a group.
func (c common) gatherGroup(ctx context.Context, gw *gatewayv1.Gateway, name string, in *gatewayInputs) error {
	var err error
	if in.group, in.groupFinding, err = groupstore.ResolveGroup(ctx, c.Client, gw.Namespace, name); err != nil || in.group == nil {
		return err
	}
	if in.states, err = c.Groups.States(ctx, in.group); err != nil {
		return err
	}
	hostname := gatewayHostname(gw)
	if !contract.ValidHostname(hostname) {
		return nil // decideGateway's finding
	}
	list := &gatewayv1.GatewayList{}
	if err := c.List(ctx, list, client.MatchingFields{indexGatewayGroupHostname: hostname}); err != nil {
		return fmt.Errorf("listing the Gateways that ask for hostname %s: %w", hostname, err)
	}
	others := make([]*gatewayv1.Gateway, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	if in.takenBy = groupstore.TakenBy(gw, others, func(o *gatewayv1.Gateway) bool {
		return o.DeletionTimestamp == nil && o.Annotations[kit.AnnotationProxyGroup] != "" && gatewayHostname(o) == hostname
	}, groupstore.FinalizerGatewayPG); in.takenBy != "" {
		in.takenBy = "Gateway " + in.takenBy
		return nil
	}
	in.takenBy, err = groupstore.TakenByOtherKind(ctx, c.Groups, "Gateway", groupServiceName(gw))
	return err
}

// groupServiceName is the Tailscale Service a Gateway on a ProxyGroup is served as.
func groupServiceName(gw *gatewayv1.Gateway) string { return "svc:" + gatewayHostname(gw) }

// GatewayAnnotations are the tailscale.com/ annotations read on a Gateway.
var GatewayAnnotations = []string{kit.AnnotationAcceptAppCaps, kit.AnnotationFunnel, kit.AnnotationHostname,
	kit.AnnotationProxyGroup, kit.AnnotationTags}

// gatewayHostname is the Gateway's tailnet hostname: the tailscale.com/hostname annotation,
// else one made of its namespace and name.
func gatewayHostname(gw *gatewayv1.Gateway) string {
	if h := gw.Annotations[kit.AnnotationHostname]; h != "" {
		return h
	}
	return kit.TruncateLabel(kit.DNSLabelish(gw.Namespace + "-" + gw.Name + "-gateway"))
}

// decideGateway decides whether a Gateway can be served, and its listeners. Its names are its
// hostname and MagicDNS name, and those the proxy reports (the tailnet may have renamed it).
func decideGateway(gw *gatewayv1.Gateway, in gatewayInputs, defaultTags []string) (gatewayView, []string) {
	v := gatewayView{Key: types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}, RouteKind: in.routeKind, RouteKindOf: in.routeKindOf}
	hostname := gatewayHostname(gw)
	for _, n := range []string{hostname, hostname + "." + strings.TrimSuffix(in.domain, ".")} {
		if !strings.HasSuffix(n, ".") {
			v.Names = append(v.Names, strings.ToLower(n))
		}
	}
	if st := in.state; st != nil && st.FQDN != "" {
		short, _, _ := strings.Cut(st.FQDN, ".")
		v.Names = append(v.Names, strings.ToLower(short), strings.ToLower(st.FQDN))
	}
	slices.Sort(v.Names)
	v.Names = slices.Compact(v.Names)
	v.Listeners = decideListeners(gw.Spec.Listeners, v.Names)
	tags, tagsFinding := proxies.ParseTags(gw, defaultTags)
	switch {
	case in.groupFinding != nil:
		v.Rejected, v.Why = in.groupFinding.Reason, in.groupFinding.Message
	case in.takenBy != "":
		v.Rejected, v.Why = kit.ReasonDuplicateHostname, fmt.Sprintf("%s already serves %s on a ProxyGroup; hostnames must be unique", in.takenBy, hostname)
	case in.classNotReady != "":
		v.Rejected, v.Why = kit.ReasonInvalidParameters, in.classNotReady
	case len(gw.Spec.Addresses) > 0:
		v.Rejected, v.Why = kit.ReasonUnsupportedAddress, "spec.addresses is not served: the tailnet assigns the Gateway's addresses"
	case gw.Spec.Infrastructure != nil || gw.Spec.TLS != nil || gw.Spec.AllowedListeners != nil || gw.Spec.DefaultScope != "":
		v.Rejected, v.Why = kit.ReasonGatewayInvalid, "spec.infrastructure, spec.tls, spec.allowedListeners and spec.defaultScope are not served yet"
	case !contract.ValidHostname(hostname):
		v.Rejected, v.Why = kit.ReasonGatewayInvalid, fmt.Sprintf("tailnet hostname %q is not a valid DNS label", hostname)
	case tagsFinding != nil:
		v.Rejected, v.Why = kit.ReasonGatewayInvalid, tagsFinding.Message
	}
	return v, tags
}

// gatewayScope is what a pass over a Gateway reads and decides.
type gatewayScope struct {
	gw    *gatewayv1.Gateway
	in    gatewayInputs
	facts gatewayFacts
	// decided is set once the facts are complete; the status is left as it was otherwise.
	decided bool
}

func (r *GatewayReconciler) serve(ctx context.Context, gw *gatewayv1.Gateway) (_ ctrl.Result, err error) {
	s := &gatewayScope{gw: gw}
	defer func() {
		if !s.decided {
			return
		}
		before := gw.DeepCopy()
		gw.Status = gatewayStatus(gw.Status, s.facts, gw.Generation)
		if perr := kit.PatchStatus(ctx, r.Client, before, gw); perr != nil && err == nil {
			err = fmt.Errorf("writing the status of Gateway %s/%s: %w", gw.Namespace, gw.Name, perr)
		}
	}()
	if s.in, err = r.gatherGateway(ctx, gw); err != nil {
		return ctrl.Result{}, err
	}
	if s.in.unreadable != nil {
		r.Findings(gw, []kit.Finding{*s.in.unreadable})
	}
	view, tags := decideGateway(gw, s.in, r.Settings.DefaultTags)
	s.facts = gatewayFacts{View: view, Attached: map[gatewayv1.SectionName]int32{}}
	if !s.in.onGroup {
		s.facts.standalone(s.in.state)
	}
	s.decided = true
	for _, l := range view.Listeners {
		if !l.served() {
			r.Warning(gw, l.NotAccepted, "listener %q: %s", l.Name, l.Why)
		}
	}
	if view.Rejected != "" {
		r.Warning(gw, view.Rejected, "%s", view.Why)
		return ctrl.Result{}, nil // what serves it is left as it was rather than torn down over a typo
	}
	if s.in.classIgnored != "" {
		r.Warning(gw, kit.ReasonProxyClassIgnored, "%s", s.in.classIgnored)
	}
	if !slices.ContainsFunc(view.Listeners, listenerDecision.served) {
		return ctrl.Result{}, nil
	}
	byo, problems, err := r.certificateRefs(ctx, gw, view, s.in.onGroup)
	if err != nil {
		return ctrl.Result{}, err
	}
	view = withRefProblems(view, problems)
	s.facts.View = view
	for _, l := range view.Listeners {
		if l.RefProblem != "" {
			r.Warning(gw, l.RefProblem, "listener %q: %s", l.Name, l.RefWhy)
		}
	}
	byPort, err := r.attachedRoutes(ctx, s.in.routes, &view, s.facts.Attached)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !slices.ContainsFunc(view.Listeners, listenerDecision.programmable) {
		// Nothing to serve until a certificate resolves: what serves it is left as it was.
		return ctrl.Result{RequeueAfter: byo.Recheck}, nil
	}
	if s.in.certsOff {
		r.Warning(gw, kit.ReasonHTTPSNotEnabled, "HTTPS is not enabled on the tailnet (or MagicDNS is off): the proxy cannot get a certificate until it is")
	}
	if f := proxies.InitContainerIgnored(s.in.class); f != nil {
		r.Findings(gw, []kit.Finding{*f})
	}
	s.facts.Funnel.On, s.facts.Funnel.Refused = kit.ParseFunnel(gw.Annotations, "Gateway", gw.Namespace, r.Settings.FunnelAllowed(gw.Namespace))
	if s.facts.Funnel.On && !slices.ContainsFunc(view.Listeners, funnelListener) {
		f := kit.Warnf(kit.ReasonInvalidAnnotation, "annotation %s: Funnel serves port 443 over HTTPS, and no listener of the Gateway does; served on the tailnet only", kit.AnnotationFunnel)
		s.facts.Funnel.On, s.facts.Funnel.Refused = false, &f
	}
	s.facts.Funnel.Tags = tags
	if f := s.facts.Funnel.Refused; f != nil {
		r.Findings(gw, []kit.Finding{*f})
	}
	var appCaps []string
	if v, ok := gw.Annotations[kit.AnnotationAcceptAppCaps]; ok {
		var f *kit.Finding
		if appCaps, f = kit.ParseAcceptAppCaps(v); f != nil {
			r.Findings(gw, []kit.Finding{*f})
		}
	}
	if f := kit.UnsupportedAnnotations("Gateway", gw.Annotations, GatewayAnnotations...); f != nil {
		r.Findings(gw, []kit.Finding{*f})
	}
	ws := webService(view, byPort, appCaps)
	ws.Funnel = s.facts.Funnel.On
	ws.TLS.Certificates = byo.Refs
	if s.in.onGroup {
		s.facts.Funnel.Tags = groupstore.Tags(s.in.group, r.Settings.DefaultTags)
		return r.serveOnGroup(ctx, s, ws, tags)
	}
	if res, err := r.leaveGroup(ctx, gw); err != nil || res.RequeueAfter > 0 {
		return res, err
	}
	if err := kit.AddFinalizer(ctx, r.Client, gw, kit.FinalizerName); err != nil {
		return ctrl.Result{}, err
	}
	p := r.proxy(gw, ws, tags, s.in.class)
	p.CertSecrets = byo.Copies
	cert, err := r.certificate(ctx, gw, p, s.in)
	if err != nil {
		return ctrl.Result{}, err
	}
	created, err := r.Proxies.Ensure(ctx, p)
	if err != nil {
		return r.TailnetFailure(gw, err)
	}
	if created {
		r.Created(gw, kit.ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.Name(), p.Config.Hostname)
	}
	if st := s.in.state; st != nil && st.FQDN != "" {
		r.Progress(gw, "joined", kit.ReasonDeviceJoined, "the proxy joined the tailnet as %s", st.FQDN)
	}
	r.reportServing(gw, s.facts)
	return ctrl.Result{RequeueAfter: cert.Recheck(byo.Recheck, r.Guard.Now())}, nil
}

// funnelListener reports whether a listener is one Funnel can serve: HTTPS on port 443.
func funnelListener(l listenerDecision) bool {
	return l.programmable() && l.Protocol == gatewayv1.HTTPSProtocolType && l.Port == 443
}

// reportServing reports that the Gateway's tailnet name is served, and what became of Funnel.
func (r *GatewayReconciler) reportServing(gw *gatewayv1.Gateway, f gatewayFacts) {
	if !f.serving() {
		return
	}
	r.Progress(gw, "serving", kit.ReasonServing, "serving %s%s", f.servedURL(), f.ServedBy)
	if f.Funnel.On {
		kit.ReportFunnel(r.Reporter, gw, f.Served, f.Funnel.Tags, f.States)
	}
}

// serveOnGroup serves a Gateway as a Tailscale Service of its ProxyGroup: the standalone proxy
// it may have had goes first (the two would ask for one name), then the service is claimed,
// its certificate decided and its entry written on the group.
func (r *GatewayReconciler) serveOnGroup(ctx context.Context, s *gatewayScope, ws contract.WebService, tags []string) (ctrl.Result, error) {
	gw, pg := s.gw, s.in.group
	if controllerutil.ContainsFinalizer(gw, kit.FinalizerName) {
		if res, err := r.removeProxy(ctx, gw); err != nil || res.RequeueAfter > 0 {
			return res, err
		}
		if err := kit.RemoveFinalizer(ctx, r.Client, gw, kit.FinalizerName); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := kit.AddFinalizer(ctx, r.Client, gw, groupstore.FinalizerGatewayPG); err != nil {
		return ctrl.Result{}, err
	}
	svcName := groupServiceName(gw)
	ts, err := r.Groups.ClaimService(ctx, "Gateway", gw, svcName, groupstore.WebPorts(&ws), tags)
	if err != nil {
		return groupstore.ClaimFailure(r.Reporter, gw, err)
	}
	if ts.Created {
		r.Created(gw, kit.ReasonTailscaleServiceCreated, "created Tailscale Service %s (%s) for ProxyGroup %s", svcName, groupstore.AddrList(ts.Addrs), pg.Name)
	}
	gc := groupstore.GroupCert{Client: r.Client, Guard: r.Guard, Namespace: r.Settings.Namespace, DefaultProxyClass: r.Settings.DefaultProxyClass}
	cert, err := gc.Certificate(ctx, r.Reporter, gw, pg, gatewayHostname(gw), s.in.domain, s.in.states)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("deciding the certificate of Gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	certs.CertificateIssued(r.Reporter, gw, cert, r.Guard.Now())
	ws.TLS.Hold = cert.Hold
	if err := r.Groups.Put(ctx, groupstore.Entry{Kind: "Gateway", Object: gw, Group: pg.Name, Service: svcName, Web: &ws}); err != nil {
		return groupstore.PutFailure(r.Reporter, gw, err)
	}
	s.facts.onGroup(pg.Name, svcName, ts.Addrs, cert, s.in.states, r.Guard.Now())
	r.reportServing(gw, s.facts)
	return ctrl.Result{RequeueAfter: groupstore.Sooner(cert.Recheck(0, r.Guard.Now()), ts.Recheck)}, nil
}

// leaveGroup takes a Gateway that left its ProxyGroup off every group.
func (r *GatewayReconciler) leaveGroup(ctx context.Context, gw *gatewayv1.Gateway) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(gw, groupstore.FinalizerGatewayPG) {
		return ctrl.Result{}, nil
	}
	if err := r.Groups.Withdraw(ctx, "Gateway", gw, groupServiceName(gw)); err != nil {
		return r.TailnetFailure(gw, err)
	}
	return ctrl.Result{}, kit.RemoveFinalizer(ctx, r.Client, gw, groupstore.FinalizerGatewayPG)
}

// attachedRoutes decides the routes that name the Gateway (list, as gathered: oldest first, the
// spec's precedence between routes), counts those attached to each listener, and returns the
// contract routes of the accepted ones by port, each with the hosts of the listener it attached
// to; the first of a match wins.
func (r *GatewayReconciler) attachedRoutes(ctx context.Context, list []gatewayv1.HTTPRoute, view *gatewayView, attached map[gatewayv1.SectionName]int32) (map[gatewayv1.PortNumber][]contract.Route, error) {
	in, err := gatherRouteInputs(ctx, r.Client, list)
	if err != nil {
		return nil, err
	}
	byPort := map[gatewayv1.PortNumber][]contract.Route{}
	seen := map[gatewayv1.PortNumber]map[string]bool{}
	for i := range list {
		d := decideRoute(&list[i], map[types.NamespacedName]*gatewayView{view.Key: view}, in)
		listeners := map[gatewayv1.SectionName]bool{}
		for _, p := range d.Parents {
			for _, l := range p.Listeners {
				listeners[l] = listeners[l] || p.accepted()
			}
		}
		for _, l := range view.Listeners {
			if !listeners[l.Name] {
				continue
			}
			attached[l.Name]++
			if !l.programmable() {
				continue // attached, not served: its certificate does not resolve
			}
			if seen[l.Port] == nil {
				seen[l.Port] = map[string]bool{}
			}
			for _, host := range routeHosts(list[i].Spec.Hostnames, l, view.Names) {
				for _, rt := range d.Routes {
					rt.Host = host
					if key := rt.MatchKey(); !seen[l.Port][key] {
						seen[l.Port][key] = true
						byPort[l.Port] = append(byPort[l.Port], rt)
					}
				}
			}
		}
	}
	return byPort, nil
}

// webService is what serves a Gateway's routes, on a standalone proxy or a ProxyGroup: a port
// per port of its served listeners, each with the routes attached to them.
func webService(view gatewayView, byPort map[gatewayv1.PortNumber][]contract.Route, appCaps []string) contract.WebService {
	// No Ingress label: the proxy's request metrics name Ingresses only, until the contract can
	// name a Gateway.
	ws := contract.WebService{AcceptAppCaps: appCaps}
	for _, l := range view.Listeners {
		if !l.programmable() || slices.ContainsFunc(ws.Ports, func(p contract.WebPort) bool { return p.Port == int(l.Port) }) {
			continue
		}
		routes := byPort[l.Port]
		// A port has a route: without any attached, one answers every request 404, as the spec
		// asks of a listener without routes.
		if len(routes) == 0 {
			routes = []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{Status: http.StatusNotFound}}}
		}
		ws.Ports = append(ws.Ports, contract.WebPort{Port: int(l.Port), TLS: l.Protocol == gatewayv1.HTTPSProtocolType, Routes: routes})
	}
	slices.SortFunc(ws.Ports, func(a, b contract.WebPort) int { return a.Port - b.Port })
	return withoutPorts(ws)
}

// withoutPorts writes a web service of ports as one of routes when that says the same: HTTPS on
// 443 alone, or with plain HTTP on 80 serving the same routes, and no wildcard host (which
// covers one label there, any number in a port's routes). A proxy older than ports serves it.
func withoutPorts(ws contract.WebService) contract.WebService {
	p := ws.Ports
	if len(p) == 0 || len(p) > 2 || p[len(p)-1].Port != 443 || !p[len(p)-1].TLS ||
		(len(p) == 2 && (p[0].Port != 80 || p[0].TLS || !reflect.DeepEqual(p[0].Routes, p[1].Routes))) ||
		slices.ContainsFunc(ws.AllRoutes(), func(r contract.Route) bool { return contract.IsWildcard(r.Host) }) {
		return ws
	}
	ws.Routes, ws.Ports = p[len(p)-1].Routes, nil
	if len(p) == 2 {
		ws.HTTP = contract.HTTPServe
	}
	return ws
}

// proxy builds the standalone proxy that serves a Gateway's web service.
func (r *GatewayReconciler) proxy(gw *gatewayv1.Gateway, ws contract.WebService, tags []string, class *tsv1alpha1.ProxyClass) *proxies.StandaloneProxy {
	return &proxies.StandaloneProxy{
		Parent: proxies.ParentOf(proxies.ParentTypeGateway, gw),
		Class:  class,
		Config: contract.ProxyConfig{
			Kind:       contract.KindIngress,
			Hostname:   gatewayHostname(gw),
			Tags:       tags,
			ControlURL: r.Settings.ControlURL,
			Serve:      &ws,
			TLS:        contract.TLSConfig{ACMEDirectoryURL: proxies.ACMEDirectory(r.Settings, class)},
		},
	}
}

// certificate records the certificates the proxy reports and decides whether it may ask the
// CA for the tailnet name's certificate, through the operator's rate-limit guard; a hold goes
// into the web service.
func (r *GatewayReconciler) certificate(ctx context.Context, gw *gatewayv1.Gateway, p *proxies.StandaloneProxy, in gatewayInputs) (certs.TailnetCert, error) {
	c := certs.TailnetCert{}
	switch st := in.state; {
	case st != nil && st.FQDN != "":
		c.FQDN = st.FQDN
	case in.domain != "":
		c.FQDN = p.Config.Hostname + "." + in.domain
	}
	staging := p.Class != nil && p.Class.Spec.UseLetsEncryptStagingEnvironment
	if st := in.state; st != nil {
		if err := r.Guard.Observe(ctx, st.Certificates, staging); err != nil {
			return c, fmt.Errorf("recording the certificates of Gateway %s/%s's proxy: %w", gw.Namespace, gw.Name, err)
		}
		c.Cur = st.Certificates[c.FQDN]
	}
	if err := r.Guard.Decide(ctx, r.Reporter, gw, &c, staging); err != nil {
		return c, fmt.Errorf("deciding the certificate of %s: %w", c.FQDN, err)
	}
	certs.CertificateIssued(r.Reporter, gw, c, r.Guard.Now())
	p.Config.Serve.TLS.Hold = c.Hold
	return c, nil
}

// removeProxy tears down a Gateway's standalone proxy, if it has one.
func (r *GatewayReconciler) removeProxy(ctx context.Context, gw *gatewayv1.Gateway) (ctrl.Result, error) {
	done, refused, err := r.Proxies.Teardown(ctx, proxies.ParentOf(proxies.ParentTypeGateway, gw))
	if refused != nil {
		r.Findings(gw, []kit.Finding{*refused})
	}
	if err != nil {
		if tailnet.ReasonOf(err) != "" {
			r.Warning(gw, kit.ReasonCleanupFailed, "removing the proxy: %v", err)
			return ctrl.Result{RequeueAfter: kit.TailnetRetry}, nil
		}
		return ctrl.Result{}, fmt.Errorf("removing the proxy of Gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	if !done {
		return ctrl.Result{RequeueAfter: kit.CleanupPoll}, nil
	}
	return ctrl.Result{}, nil
}

// unserve removes what serves a Gateway that is deleted or no longer of a class of ours: its
// standalone proxy or its group entry and Tailscale Service.
func (r *GatewayReconciler) unserve(ctx context.Context, gw *gatewayv1.Gateway) (ctrl.Result, error) {
	standalone := controllerutil.ContainsFinalizer(gw, kit.FinalizerName)
	if !standalone && !controllerutil.ContainsFinalizer(gw, groupstore.FinalizerGatewayPG) {
		r.Forget(client.ObjectKeyFromObject(gw)) // never served: its status is not ours
		return ctrl.Result{}, nil
	}
	if res, err := r.leaveGroup(ctx, gw); err != nil || res.RequeueAfter > 0 {
		return res, err
	}
	if standalone {
		if res, err := r.removeProxy(ctx, gw); err != nil || res.RequeueAfter > 0 {
			return res, err
		}
	}
	return kit.Unserved(ctx, r.Client, r.Reporter, gw, kit.FinalizerName, func(ctx context.Context) error {
		before := gw.DeepCopy()
		gw.Status = gatewayv1.GatewayStatus{}
		return kit.PatchStatus(ctx, r.Client, before, gw)
	})
}

// SetupWithManager watches Gateways, their proxies' children, their ProxyGroups and the
// groups' objects, the HTTPRoutes that name them, the Services and ReferenceGrants those resolve
// through, the labels of the routes' namespaces, and ProxyClasses, ProxyGroupPolicies and
// GatewayClasses.
func (r *GatewayReconciler) SetupWithManager(mgr ctrl.Manager) error {
	children := handler.EnqueueRequestsFromMapFunc(kit.ParentRequests(proxies.ParentTypeGateway))
	group := r.Groups.Events("Gateway", r.onGroup)
	return ctrl.NewControllerManagedBy(mgr).
		For(&gatewayv1.Gateway{}).
		Named("gateway").
		Watches(&appsv1.StatefulSet{}, children).
		Watches(&corev1.Secret{}, children).
		Watches(&corev1.Pod{}, children).
		Watches(&tsv1alpha1.ProxyGroup{}, group).
		Watches(&corev1.Secret{}, group).
		Watches(&corev1.ConfigMap{}, group).
		Watches(&tsv1alpha1.ProxyGroupPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.gateways(ctx, client.InNamespace(o.GetNamespace()))
		})).
		// Not a route's status, which the route reconcilers write from the same decision.
		Watches(&gatewayv1.HTTPRoute{}, handler.EnqueueRequestsFromMapFunc(routeParents), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&gatewayv1.GRPCRoute{}, handler.EnqueueRequestsFromMapFunc(routeParents), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.gatewaysForService)).
		Watches(&gatewayv1.ReferenceGrant{}, handler.EnqueueRequestsFromMapFunc(r.allGateways)).
		Watches(&tsv1alpha1.ProxyClass{}, handler.EnqueueRequestsFromMapFunc(r.allGateways)).
		Watches(&gatewayv1.GatewayClass{}, handler.EnqueueRequestsFromMapFunc(r.allGateways)).
		WatchesMetadata(namespaceMetadata(), handler.EnqueueRequestsFromMapFunc(r.gatewaysOfRoutesIn), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WatchesRawSource(r.TLSSecrets.Source(r.gatewaysForTLSSecret)).
		Complete(r)
}

// gatewaysOfRoutesIn maps a Namespace to the Gateways its routes name, which its labels may
// let them attach to or not.
func (r *GatewayReconciler) gatewaysOfRoutesIn(ctx context.Context, o client.Object) []reconcile.Request {
	routes, err := listRoutes(ctx, r.Client, client.InNamespace(o.GetName()))
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing routes", "namespace", o.GetName())
		return nil
	}
	var out []reconcile.Request
	for i := range routes {
		out = append(out, routeParents(ctx, &routes[i])...)
	}
	return out
}

// olderRoute orders routes oldest first, then by namespace and name: the spec's precedence
// between routes.
func olderRoute(a, b gatewayv1.HTTPRoute) int {
	return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name))
}

// routeParents maps a route to the Gateways it names.
func routeParents(_ context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, key := range parentKeys(asHTTPRoute(o)) {
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	return out
}

// gatewaysForService maps a Service to the Gateways of the routes that name it.
func (r *GatewayReconciler) gatewaysForService(ctx context.Context, o client.Object) []reconcile.Request {
	list, err := listRoutes(ctx, r.Client, client.MatchingFields{indexRouteBackends: client.ObjectKeyFromObject(o).String()})
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the routes of a Service", "service", client.ObjectKeyFromObject(o))
		return nil
	}
	var out []reconcile.Request
	for i := range list {
		out = append(out, routeParents(ctx, &list[i])...)
	}
	return out
}

// onGroup lists the Gateways on ProxyGroup pg.
func (r *GatewayReconciler) onGroup(ctx context.Context, pg string) []reconcile.Request {
	return r.gateways(ctx, client.MatchingFields{indexGatewayGroup: pg})
}

// allGateways maps a change that may concern any Gateway (a grant, a class) to every Gateway.
// They are few, and such changes rare.
func (r *GatewayReconciler) allGateways(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.gateways(ctx)
}

// gateways lists the Gateways opts select.
func (r *GatewayReconciler) gateways(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	list := &gatewayv1.GatewayList{}
	if err := r.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing Gateways")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}
