package controller

import (
	"context"
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

// tailnetRetry is the least time before retrying after a control-plane error: such errors
// (bad credentials, tags not permitted) rarely fix themselves in seconds.
const tailnetRetry = time.Minute

// cleanupPoll re-checks a cleanup waiting for a StatefulSet, in case a watch event is missed.
const cleanupPoll = 5 * time.Second

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

	class, notReady, err := readyProxyClass(ctx, r.Client, proxyClassName(ing, r.Settings.DefaultProxyClass))
	if err != nil {
		return ctrl.Result{}, err
	}
	if notReady != "" {
		// The ProxyClass watch brings the Ingress back once the class is ready.
		r.warning(ing, ReasonProxyClassNotReady, "%s; waiting for it", notReady)
		return ctrl.Result{}, nil
	}

	info := r.proxies.tailnetInfo(ctx)
	p, byo, ok, err := r.desiredProxy(ctx, ing, class, info.Domain)
	if err != nil || !ok {
		return ctrl.Result{}, err
	}
	if !info.CertsAvailable() {
		r.warning(ing, ReasonHTTPSNotEnabled, "HTTPS is not enabled on the tailnet (or MagicDNS is off): the proxy cannot get a certificate until it is")
	}
	st, _, unreadable, err := r.proxies.state(ctx, p.parent)
	if err != nil {
		return ctrl.Result{}, err
	}
	if unreadable != nil {
		r.findings(ing, []finding{*unreadable})
	}
	cert, err := r.certificate(ctx, ing, p, st, info.Domain)
	if err != nil {
		return ctrl.Result{}, err
	}
	created, err := r.proxies.ensure(ctx, p)
	if err != nil {
		return r.tailnetFailure(ing, err)
	}
	if created {
		r.created(ing, ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.name(), p.config.Hostname)
	}
	if st != nil && st.FQDN != "" {
		r.progress(ing, "joined", ReasonDeviceJoined, "the proxy joined the tailnet as %s", st.FQDN)
	}
	if err := r.updateStatus(ctx, ing, p, st, cert); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: cert.recheck(byo.recheck, r.guard.now())}, nil
}

// tailnetCert is the state of an Ingress's tailnet name's certificate during a pass.
type tailnetCert struct {
	fqdn string
	cur  contract.CertificateStatus
	hold *contract.IssuanceHold
}

// recheck is when to look again without a watch event: when a hold ends or a bring-your-own
// certificate expires (0: no need).
func (c tailnetCert) recheck(byo time.Duration, now time.Time) time.Duration {
	d := byo
	if c.hold != nil && !c.hold.Until.IsZero() {
		if h := c.hold.Until.Sub(now) + time.Second; d == 0 || h < d {
			d = h
		}
	}
	return d
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

// desiredProxy builds the proxy an Ingress asks for; domain is the tailnet's ("" if unknown). ok is false when the Ingress cannot be
// served as it stands; the reasons are reported as Events, and an existing proxy is left
// untouched rather than torn down over a typo.
func (r *IngressReconciler) desiredProxy(ctx context.Context, ing *networkingv1.Ingress, class *tsv1alpha1.ProxyClass, domain string) (*standaloneProxy, byoCertificates, bool, error) {
	in, err := gatherRouteInputs(ctx, r.Client, ing, domain)
	if err != nil {
		return nil, byoCertificates{}, false, err
	}
	par := parentOf(parentTypeIngress, ing)
	byo, err := r.certs.resolve(ctx, ing, par.proxyName(), r.Settings.Namespace, par.labels())
	if err != nil {
		return nil, byo, false, err
	}
	d := decideIngress(ing, in, byo, r.Settings.DefaultTags)
	if f := initContainerIgnored(class); f != nil {
		d.findings = append(d.findings, *f)
	}
	r.findings(ing, d.findings)
	if hasBlocking(d.findings) {
		return nil, byo, false, nil
	}
	return &standaloneProxy{
		parent:      par,
		class:       class,
		certSecrets: byo.copies,
		config: contract.ProxyConfig{
			Kind:       contract.KindIngress,
			Hostname:   d.hostname,
			Tags:       d.tags,
			ControlURL: r.Settings.ControlURL,
			Serve:      &d.ws,
			TLS:        contract.TLSConfig{ACMEDirectoryURL: acmeDirectory(r.Settings, class)},
		},
	}, byo, true, nil
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

// updateStatus lists the served names: the tailnet name once the proxy serves it (or, with a
// port error, why its certificate is missing) and the bring-your-own hosts.
func (r *IngressReconciler) updateStatus(ctx context.Context, ing *networkingv1.Ingress, p *standaloneProxy, st *contract.ProxyState, cert tailnetCert) error {
	var want []networkingv1.IngressLoadBalancerIngress
	served := st != nil && st.HTTPSEndpoint != ""
	if errReason := certPortError(cert.hold, cert.cur, r.guard.now()); errReason != "" && cert.fqdn != "" {
		want = append(want, networkingv1.IngressLoadBalancerIngress{Hostname: cert.fqdn,
			Ports: []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP, Error: &errReason}}})
	} else if served {
		want = append(want, networkingv1.IngressLoadBalancerIngress{Hostname: st.HTTPSEndpoint, Ports: httpsPorts(p.config.Serve.HTTP != contract.HTTPOff)})
		r.progress(ing, "serving", ReasonServing, "serving https://%s", st.HTTPSEndpoint)
	}
	if served {
		want = append(want, byoStatus(p.config.Serve.TLS.Certificates, st.Certificates, r.guard.now())...)
		if p.config.Serve.Funnel {
			if reason := r.funnel(ing, st.HTTPSEndpoint, p.config.Tags, []*contract.ProxyState{st}); reason != "" {
				setPortError(want, st.HTTPSEndpoint, reason)
			}
		}
	}
	return setIngressLoadBalancer(ctx, r.Client, ing, want)
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

// SetupWithManager watches Ingresses, their proxies' children, backend Services and their
// EndpointSlices, and ProxyClasses.
func (r *IngressReconciler) SetupWithManager(mgr ctrl.Manager, p *proxies) error {
	r.proxies = p
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &networkingv1.Ingress{}, indexIngressBackends,
		func(o client.Object) []string { return backendServiceNames(o.(*networkingv1.Ingress)) }); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &networkingv1.Ingress{}, indexIngressTLSSecrets,
		func(o client.Object) []string { return tlsSecretNames(o.(*networkingv1.Ingress)) }); err != nil {
		return err
	}
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

// parentRequests maps a child object to its parent through the parent labels.
func parentRequests(typ string) handler.MapFunc {
	return func(_ context.Context, o client.Object) []reconcile.Request {
		l := o.GetLabels()
		if l[LabelManaged] != "true" || l[LabelParentType] != typ {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: l[LabelParentNS], Name: l[LabelParentName]}}}
	}
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
		return r.serves(ing) && proxyClassName(ing, r.Settings.DefaultProxyClass) == o.GetName()
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
