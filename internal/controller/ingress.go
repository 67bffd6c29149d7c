package controller

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/tailnet"
)

const (
	indexIngressBackends   = "tsingress.ingress.backends"
	indexIngressTLSSecrets = "tsingress.ingress.tls-secrets"
)

// IngressReconciler serves Ingresses of the tailscale class (without the proxy-group
// annotation) through a standalone proxy each.
type IngressReconciler struct {
	client.Client
	reporter
	Settings Settings
	proxies  *proxies
	certs    certSecrets
	guard    *certGuard
	// tlsSecrets sees users' TLS Secrets change.
	tlsSecrets *tlsSecretWatch
}

// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingressclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch
// The ready endpoints of backend Services, which the proxies balance across.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// Bring-your-own certificates are read from the Ingress's namespace.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,namespace=system,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=system,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete;bind;escalate

// serves reports whether this reconciler is responsible for ing.
func (r *IngressReconciler) serves(ing *networkingv1.Ingress) bool {
	return ing.DeletionTimestamp == nil &&
		ing.Spec.IngressClassName != nil && *ing.Spec.IngressClassName == r.Settings.IngressClassName &&
		ing.Annotations[AnnotationProxyGroup] == ""
}

func (r *IngressReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	ing := &networkingv1.Ingress{}
	if err := r.Get(ctx, req.NamespacedName, ing); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.serves(ing) {
		return r.unserve(ctx, ing)
	}
	defer func() { r.settle(ing, err == nil) }()
	if err := addFinalizer(ctx, r.Client, ing, FinalizerName); err != nil {
		return ctrl.Result{}, err
	}
	s := &ingressScope{ing: ing}
	// Status is computed from what this pass observed and patched once, at the end.
	defer func() {
		if lb, decided := s.loadBalancer(r.guard.now()); decided {
			if perr := setIngressLoadBalancer(ctx, r.Client, ing, lb); perr != nil && err == nil {
				err = fmt.Errorf("writing Ingress status: %w", perr)
			}
		}
	}()
	if err := r.gather(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if s.classNotReady != "" {
		// The ProxyClass watch brings the Ingress back once the class is ready.
		r.warning(ing, ReasonProxyClassNotReady, "%s; waiting for it", s.classNotReady)
		return ctrl.Result{}, nil
	}
	p, findings := decideStandaloneIngress(s, r.Settings)
	r.findings(ing, findings)
	if hasBlocking(findings) {
		// An existing proxy is left untouched rather than torn down over a typo.
		return ctrl.Result{}, nil
	}
	if !s.info.CertsAvailable() {
		r.warning(ing, ReasonHTTPSNotEnabled, "HTTPS is not enabled on the tailnet (or MagicDNS is off): the proxy cannot get a certificate until it is")
	}
	if s.unreadable != nil {
		r.findings(ing, []finding{*s.unreadable})
	}
	if s.cert, err = r.certificate(ctx, ing, p, s.state, s.info.Domain); err != nil {
		return ctrl.Result{}, err
	}
	created, err := r.proxies.ensure(ctx, p)
	if err != nil {
		return r.tailnetFailure(ing, err)
	}
	s.proxy = p
	if created {
		r.created(ing, ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.name(), p.config.Hostname)
	}
	if st := s.state; st != nil && st.FQDN != "" {
		r.progress(ing, "joined", ReasonDeviceJoined, "the proxy joined the tailnet as %s", st.FQDN)
	}
	if st := s.state; st != nil && st.HTTPSEndpoint != "" {
		// Not while the certificate is missing: the name is listed with the port's error then.
		if certPortError(s.cert.hold, s.cert.cur, r.guard.now()) == "" || s.cert.fqdn == "" {
			r.progress(ing, "serving", ReasonServing, "serving https://%s", st.HTTPSEndpoint)
		}
		if p.config.Serve.Funnel {
			r.funnel(ing, st.HTTPSEndpoint, p.config.Tags, []*contract.ProxyState{st})
		}
	}
	return ctrl.Result{RequeueAfter: s.cert.recheck(s.byo.recheck, r.guard.now())}, nil
}

// ingressScope is what a pass over a standalone Ingress reads, and the proxy it applied.
type ingressScope struct {
	ing           *networkingv1.Ingress
	class         *tsv1alpha1.ProxyClass
	classNotReady string
	info          tailnet.TailnetInfo
	routes        routeInputs
	byo           byoCertificates
	// state is what the proxy reports (nil: nothing yet); unreadable says why it cannot be read.
	state      *contract.ProxyState
	unreadable *finding
	cert       tailnetCert
	// proxy is the proxy applied in this pass; nil leaves the status as it was.
	proxy *standaloneProxy
}

func (r *IngressReconciler) gather(ctx context.Context, s *ingressScope) error {
	class, err := resolveProxyClass(ctx, r.Client, s.ing, r.Settings.DefaultProxyClass)
	if s.class, s.classNotReady = class.ready(), class.notReady; err != nil || s.classNotReady != "" {
		return err
	}
	s.info = r.proxies.tailnetInfo(ctx)
	if s.routes, err = gatherRouteInputs(ctx, r.Client, s.ing, s.info.Domain); err != nil {
		return err
	}
	par := parentOf(parentTypeIngress, s.ing)
	if s.byo, err = r.certs.resolve(ctx, s.ing, par.proxyName(), r.Settings.Namespace, par.labels()); err != nil {
		return err
	}
	s.state, _, s.unreadable, err = r.proxies.state(ctx, par)
	return err
}

// decideStandaloneIngress builds the proxy an Ingress asks for, with what stops it or is left out.
func decideStandaloneIngress(s *ingressScope, settings Settings) (*standaloneProxy, []finding) {
	d := decideIngress(s.ing, s.routes, s.byo, settings.DefaultTags)
	if f := initContainerIgnored(s.class); f != nil {
		d.findings = append(d.findings, *f)
	}
	return &standaloneProxy{
		parent:      parentOf(parentTypeIngress, s.ing),
		class:       s.class,
		certSecrets: s.byo.copies,
		config: contract.ProxyConfig{
			Kind:       contract.KindIngress,
			Hostname:   d.hostname,
			Tags:       d.tags,
			ControlURL: settings.ControlURL,
			Serve:      &d.ws,
			TLS:        contract.TLSConfig{ACMEDirectoryURL: acmeDirectory(settings, s.class)},
		},
	}, d.findings
}

// certificate records the certificates the proxy reports and decides whether it may ask the
// CA for its tailnet name's certificate; a hold goes into its Serve config.
func (r *IngressReconciler) certificate(ctx context.Context, ing *networkingv1.Ingress, p *standaloneProxy, st *contract.ProxyState, domain string) (tailnetCert, error) {
	c := tailnetCert{}
	switch {
	case st != nil && st.FQDN != "":
		c.fqdn = st.FQDN
	case domain != "":
		c.fqdn = p.config.Hostname + "." + domain
	}
	staging := p.class != nil && p.class.Spec.UseLetsEncryptStagingEnvironment
	if st != nil {
		if err := r.guard.observe(ctx, st.Certificates, staging); err != nil {
			return c, err
		}
		c.cur = st.Certificates[c.fqdn]
	}
	if err := r.guard.decide(ctx, r.reporter, ing, &c, staging); err != nil {
		return c, err
	}
	r.certificateIssued(ing, c, r.guard.now())
	p.config.Serve.TLS.Hold = c.hold
	return c, nil
}

// ingressDecision is what an Ingress asks a proxy (standalone or a group's) to serve.
type ingressDecision struct {
	ws       contract.WebService
	tags     []string
	hostname string
	findings []finding
}

// decideIngress decides from what a pass read (the backend Services, the bring-your-own
// certificates) what an Ingress asks to serve, and what stops it or is left out.
func decideIngress(ing *networkingv1.Ingress, in routeInputs, byo byoCertificates, defaultTags []string) ingressDecision {
	d := ingressDecision{hostname: ingressHostname(ing)}
	if !contract.ValidHostname(d.hostname) {
		d.findings = append(d.findings, blockf(ReasonInvalidHostname, "tailnet hostname %q (from the first TLS host) is not a valid DNS label", d.hostname))
	}
	ws, routeFindings := buildWebService(ing, in)
	ws.TLS.Certificates = byo.refs
	d.ws = ws
	d.findings = append(d.findings, routeFindings...)
	d.findings = append(d.findings, byo.findings...)
	tags, f := parseTags(ing, defaultTags)
	if f != nil {
		d.findings = append(d.findings, *f)
	}
	d.tags = tags
	if len(ws.Routes) == 0 {
		d.findings = append(d.findings, blockf(ReasonNoValidBackends, "no path of this Ingress can be served; nothing changed"))
	}
	return d
}

// loadBalancer is the Ingress's status.loadBalancer.ingress once the pass applied its proxy
// (decided false: leave it as it was): the tailnet name once the proxy serves it (or, with a
// port error, why its certificate or Funnel is missing) and the bring-your-own hosts.
func (s *ingressScope) loadBalancer(now time.Time) (lb []networkingv1.IngressLoadBalancerIngress, decided bool) {
	if s.proxy == nil {
		return nil, false
	}
	ws, st := s.proxy.config.Serve, s.state
	served := st != nil && st.HTTPSEndpoint != ""
	if errReason := certPortError(s.cert.hold, s.cert.cur, now); errReason != "" && s.cert.fqdn != "" {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: s.cert.fqdn,
			Ports: []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP, Error: &errReason}}})
	} else if served {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: st.HTTPSEndpoint, Ports: httpsPorts(ws.HTTP != contract.HTTPOff)})
	}
	if served {
		lb = append(lb, byoStatus(ws.TLS.Certificates, st.Certificates, now)...)
		if ws.Funnel {
			setFunnelPortError(lb, st.HTTPSEndpoint, []*contract.ProxyState{st})
		}
	}
	return lb, true
}

func httpsPorts(http bool) []networkingv1.IngressPortStatus {
	ports := []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP}}
	if http {
		ports = append(ports, networkingv1.IngressPortStatus{Port: 80, Protocol: corev1.ProtocolTCP})
	}
	return ports
}

// byoStatus lists the bring-your-own hosts the proxy serves with a valid certificate. Wildcards
// are left out: a status hostname must be a DNS name, and the API refuses "*.example.com".
func byoStatus(refs []contract.CertificateRef, certs map[string]contract.CertificateStatus, now time.Time) []networkingv1.IngressLoadBalancerIngress {
	var out []networkingv1.IngressLoadBalancerIngress
	for _, ref := range refs {
		for _, h := range ref.Hosts {
			if contract.IsWildcard(h) {
				continue
			}
			if c, ok := certs[h]; ok && c.Valid(now) {
				out = append(out, networkingv1.IngressLoadBalancerIngress{Hostname: h, Ports: httpsPorts(false)})
			}
		}
	}
	return out
}

// unserve removes the proxy of an Ingress that is deleted or no longer ours.
func (r *IngressReconciler) unserve(ctx context.Context, ing *networkingv1.Ingress) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ing, FinalizerName) {
		r.forget(client.ObjectKeyFromObject(ing))
		return ctrl.Result{}, nil
	}
	done, err := r.proxies.cleanup(ctx, parentOf(parentTypeIngress, ing))
	if err != nil {
		if tailnet.ReasonOf(err) != "" {
			r.warning(ing, ReasonCleanupFailed, "removing the proxy: %v", err)
			return ctrl.Result{RequeueAfter: tailnetRetry}, nil
		}
		return ctrl.Result{}, err
	}
	if !done {
		return ctrl.Result{RequeueAfter: cleanupPoll}, nil
	}
	if ing.DeletionTimestamp == nil {
		if err := setIngressLoadBalancer(ctx, r.Client, ing, nil); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := removeFinalizer(ctx, r.Client, ing, FinalizerName); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(ing))
	return ctrl.Result{}, nil
}

// indexIngresses registers the indexes of Ingresses by backend Service and by TLS Secret, which
// the standalone and HA Ingress reconcilers both watch through; Setup calls it once, before
// either, so that neither depends on the other being set up.
func indexIngresses(mgr ctrl.Manager) error {
	idx, ctx := mgr.GetFieldIndexer(), context.Background()
	if err := idx.IndexField(ctx, &networkingv1.Ingress{}, indexIngressBackends,
		func(o client.Object) []string { return backendServiceNames(o.(*networkingv1.Ingress)) }); err != nil {
		return err
	}
	return idx.IndexField(ctx, &networkingv1.Ingress{}, indexIngressTLSSecrets,
		func(o client.Object) []string { return tlsSecretNames(o.(*networkingv1.Ingress)) })
}

// SetupWithManager watches Ingresses, their proxies' children, backend Services and their
// EndpointSlices, and ProxyClasses.
func (r *IngressReconciler) SetupWithManager(mgr ctrl.Manager, p *proxies) error {
	r.proxies = p
	children := handler.EnqueueRequestsFromMapFunc(parentRequests(parentTypeIngress))
	return ctrl.NewControllerManagedBy(mgr).
		For(&networkingv1.Ingress{}).
		Named("ingress").
		Watches(&appsv1.StatefulSet{}, children).
		Watches(&corev1.Secret{}, children).
		WatchesRawSource(r.tlsSecrets.source(ingressesForTLSSecret(r.Client, r.serves))).
		Watches(&corev1.Pod{}, children).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.ingressesForService)).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(ingressesForEndpointSlice(r.Client, r.serves))).
		Watches(&tsv1alpha1.ProxyClass{}, handler.EnqueueRequestsFromMapFunc(r.ingressesForProxyClass)).
		Complete(r)
}

func (r *IngressReconciler) ingressesForService(ctx context.Context, o client.Object) []reconcile.Request {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressBackends: o.GetName()}); err != nil {
		return nil
	}
	return ingressRequests(list.Items, func(*networkingv1.Ingress) bool { return true })
}

// tlsSecretNames lists the Secrets an Ingress's bring-your-own entries name.
func tlsSecretNames(ing *networkingv1.Ingress) []string {
	var names []string
	for _, t := range ing.Spec.TLS {
		if isBYO(t) {
			names = append(names, t.SecretName)
		}
	}
	return names
}

// ingressesForTLSSecret maps a user's certificate Secret to the Ingresses that serve it.
func ingressesForTLSSecret(c client.Client, keep func(*networkingv1.Ingress) bool) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := &networkingv1.IngressList{}
		if err := c.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressTLSSecrets: o.GetName()}); err != nil {
			return nil
		}
		return ingressRequests(list.Items, keep)
	}
}

func (r *IngressReconciler) ingressesForProxyClass(ctx context.Context, o client.Object) []reconcile.Request {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	return ingressRequests(list.Items, func(ing *networkingv1.Ingress) bool {
		return r.serves(ing) && proxyClassOf(ing, r.Settings.DefaultProxyClass) == o.GetName()
	})
}

func ingressRequests(items []networkingv1.Ingress, keep func(*networkingv1.Ingress) bool) []reconcile.Request {
	var reqs []reconcile.Request
	for i := range items {
		if keep(&items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&items[i])})
		}
	}
	return reqs
}
