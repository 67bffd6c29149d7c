// Package ingress holds the reconcilers of Ingresses of the tailscale class: standalone (a proxy
// of its own) and HA (an entry in a ProxyGroup's documents behind a Tailscale Service). It owns
// the routes an Ingress asks for and its Funnel; it must not reach into another reconciler's
// package.
package ingress

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// IngressReconciler serves Ingresses of the tailscale class (without the proxy-group
// annotation) through a standalone proxy each.
type IngressReconciler struct {
	client.Client
	kit.Reporter
	Settings kit.Settings
	proxies  *proxies.Proxies
	Certs    certs.CertSecrets
	Guard    *certs.CertGuard
	// TLSSecrets sees users' TLS Secrets change, BackendCAs their ConfigMaps.
	TLSSecrets *kit.NamespaceNameWatch
	BackendCAs *kit.NameWatch
}

// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingressclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch
// The ready endpoints of backend Services, which the proxies balance across.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// Bring-your-own certificates are read from the Ingress's namespace, only where its owner bound
// ClusterRole tsingress-tls-secret-reader (config/rbac) to the operator: no cluster-wide rule.
// Backend CA bundles are read from the Ingress's namespace (watched by name only).
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,namespace=system,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// The proxies' Roles grant only what the operator holds itself in its namespace (their Secrets
// and ConfigMaps), so neither escalate nor bind is needed to write them and bind them.
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,namespace=system,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete

// serves reports whether this reconciler is responsible for ing.
func (r *IngressReconciler) serves(ing *networkingv1.Ingress) bool {
	return ing.DeletionTimestamp == nil &&
		ing.Spec.IngressClassName != nil && *ing.Spec.IngressClassName == r.Settings.IngressClassName &&
		ing.Annotations[kit.AnnotationProxyGroup] == ""
}

func (r *IngressReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return kit.Served[*networkingv1.Ingress]{
		Client: r.Client, Reporter: r.Reporter, Kind: "Ingress", Finalizer: kit.FinalizerName,
		New: func() *networkingv1.Ingress { return &networkingv1.Ingress{} }, Serves: r.serves, Serve: r.serve, Unserve: r.unserve,
	}.Reconcile(ctx, req)
}

// serve runs a pass over an Ingress this reconciler serves.
func (r *IngressReconciler) serve(ctx context.Context, ing *networkingv1.Ingress) (_ ctrl.Result, err error) {
	s := &ingressScope{ing: ing}
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
	if s.classNotReady != "" {
		// The ProxyClass watch brings the Ingress back once the class is ready.
		r.Warning(ing, kit.ReasonProxyClassNotReady, "%s; waiting for it", s.classNotReady)
		return ctrl.Result{}, nil
	}
	p, findings := decideStandaloneIngress(s, r.Settings)
	r.Findings(ing, findings)
	if kit.HasBlocking(findings) {
		// An existing proxy is left untouched rather than torn down over a typo.
		return ctrl.Result{}, nil
	}
	if !s.info.CertsAvailable() {
		r.Warning(ing, kit.ReasonHTTPSNotEnabled, "HTTPS is not enabled on the tailnet (or MagicDNS is off): the proxy cannot get a certificate until it is")
	}
	if s.unreadable != nil {
		r.Findings(ing, []kit.Finding{*s.unreadable})
	}
	if s.cert, err = r.certificate(ctx, ing, p, s.state, s.info.Domain); err != nil {
		return ctrl.Result{}, err
	}
	created, err := r.proxies.Ensure(ctx, p)
	if err != nil {
		return r.TailnetFailure(ing, err)
	}
	s.proxy = p
	if created {
		r.Created(ing, kit.ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.Name(), p.Config.Hostname)
	}
	if f := proxies.LoginNeeded(p.Name(), s.state); f != nil {
		r.Findings(ing, []kit.Finding{*f})
	}
	if st := s.state; st != nil && st.FQDN != "" {
		r.Progress(ing, "joined", kit.ReasonDeviceJoined, "the proxy joined the tailnet as %s", st.FQDN)
	}
	if st := s.state; st != nil && st.HTTPSEndpoint != "" {
		// Not while the certificate is missing: the name is listed with the port's error then.
		if certs.CertPortError(s.cert.Hold, s.cert.Cur, r.Guard.Now()) == "" || s.cert.FQDN == "" {
			r.Progress(ing, "serving", kit.ReasonServing, "serving https://%s", st.HTTPSEndpoint)
		}
		if p.Config.Serve.Funnel {
			kit.ReportFunnel(r.Reporter, ing, st.HTTPSEndpoint, p.Config.Tags, []*contract.ProxyState{st})
		}
	}
	return ctrl.Result{RequeueAfter: s.cert.Recheck(s.byo.Recheck, r.Guard.Now())}, nil
}

// ingressScope is what a pass over a standalone Ingress reads, and the proxy it applied.
type ingressScope struct {
	ing           *networkingv1.Ingress
	class         *tsv1alpha1.ProxyClass
	classNotReady string
	info          tailnet.TailnetInfo
	routes        RouteInputs
	byo           certs.BYOCertificates
	// state is what the proxy reports (nil: nothing yet); unreadable says why it cannot be read.
	state      *contract.ProxyState
	unreadable *kit.Finding
	cert       certs.TailnetCert
	// proxy is the proxy applied in this pass; nil leaves the status as it was.
	proxy *proxies.StandaloneProxy
}

func (r *IngressReconciler) gather(ctx context.Context, s *ingressScope) error {
	class, err := proxies.ResolveProxyClass(ctx, r.Client, s.ing, r.Settings.DefaultProxyClass)
	if s.class, s.classNotReady = class.Ready(), class.NotReady; err != nil || s.classNotReady != "" {
		return err
	}
	s.info = r.proxies.TailnetInfo(ctx)
	if s.routes, err = gatherRouteInputs(ctx, r.Client, r.Certs.API, s.ing, s.info.Domain); err != nil {
		return err
	}
	s.routes.FunnelDenied = !r.Settings.FunnelAllowed(s.ing.Namespace)
	par := proxies.ParentOf(proxies.ParentTypeIngress, s.ing)
	if s.byo, err = r.Certs.Resolve(ctx, s.ing, par.ProxyName(), r.Settings.Namespace, par.Labels()); err != nil {
		return err
	}
	s.state, _, s.unreadable, err = r.proxies.State(ctx, par)
	return err
}

// decideStandaloneIngress builds the proxy an Ingress asks for, with what stops it or is left out.
func decideStandaloneIngress(s *ingressScope, settings kit.Settings) (*proxies.StandaloneProxy, []kit.Finding) {
	d := DecideIngress(s.ing, s.routes, s.byo, settings.DefaultTags)
	if f := proxies.InitContainerIgnored(s.class); f != nil {
		d.Findings = append(d.Findings, *f)
	}
	return &proxies.StandaloneProxy{
		Parent:      proxies.ParentOf(proxies.ParentTypeIngress, s.ing),
		Class:       s.class,
		CertSecrets: s.byo.Copies,
		Config: contract.ProxyConfig{
			Kind:       contract.KindIngress,
			Hostname:   d.Hostname,
			Tags:       d.Tags,
			ControlURL: settings.ControlURL,
			Serve:      &d.WS,
			TLS:        contract.TLSConfig{ACMEDirectoryURL: proxies.ACMEDirectory(settings, s.class)},
		},
	}, d.Findings
}

// certificate records the certificates the proxy reports and decides whether it may ask the
// CA for its tailnet name's certificate; a hold goes into its Serve config.
func (r *IngressReconciler) certificate(ctx context.Context, ing *networkingv1.Ingress, p *proxies.StandaloneProxy, st *contract.ProxyState, domain string) (certs.TailnetCert, error) {
	c := certs.TailnetCert{}
	switch {
	case st != nil && st.FQDN != "":
		c.FQDN = st.FQDN
	case domain != "":
		c.FQDN = p.Config.Hostname + "." + domain
	}
	staging := p.Class != nil && p.Class.Spec.UseLetsEncryptStagingEnvironment
	if st != nil {
		if err := r.Guard.Observe(ctx, st.Certificates, staging); err != nil {
			return c, err
		}
		c.Cur = st.Certificates[c.FQDN]
	}
	if err := r.Guard.Decide(ctx, r.Reporter, ing, &c, staging); err != nil {
		return c, err
	}
	certs.CertificateIssued(r.Reporter, ing, c, r.Guard.Now())
	p.Config.Serve.TLS.Hold = c.Hold
	return c, nil
}

// loadBalancer is the Ingress's status.loadBalancer.ingress once the pass applied its proxy
// (decided false: leave it as it was): the tailnet name once the proxy serves it (or, with a
// port error, why its certificate or Funnel is missing) and the bring-your-own hosts.
func (s *ingressScope) loadBalancer(now time.Time) (lb []networkingv1.IngressLoadBalancerIngress, decided bool) {
	if s.proxy == nil {
		return nil, false
	}
	ws, st := s.proxy.Config.Serve, s.state
	served := st != nil && st.HTTPSEndpoint != ""
	if errReason := certs.CertPortError(s.cert.Hold, s.cert.Cur, now); errReason != "" && s.cert.FQDN != "" {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: s.cert.FQDN,
			Ports: []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP, Error: &errReason}}})
	} else if served {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: st.HTTPSEndpoint, Ports: httpsPorts(ws.HTTP != contract.HTTPOff)})
	}
	if served {
		lb = append(lb, byoStatus(ws.TLS.Certificates, st.Certificates, now)...)
		if s.routes.FunnelDenied && wantsFunnel(s.ing) {
			setPortError(lb, st.HTTPSEndpoint, kit.ReasonFunnelNamespaceNotPermitted)
		}
		if ws.Funnel {
			setFunnelPortError(lb, st.HTTPSEndpoint, []*contract.ProxyState{st})
		}
	}
	return lb, true
}

// unserve removes the proxy of an Ingress that is deleted or no longer ours.
func (r *IngressReconciler) unserve(ctx context.Context, ing *networkingv1.Ingress) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ing, kit.FinalizerName) {
		r.Forget(client.ObjectKeyFromObject(ing))
		return ctrl.Result{}, nil
	}
	done, refused, err := r.proxies.Teardown(ctx, proxies.ParentOf(proxies.ParentTypeIngress, ing))
	if refused != nil {
		r.Findings(ing, []kit.Finding{*refused})
	}
	if err != nil {
		if tailnet.ReasonOf(err) != "" {
			r.Warning(ing, kit.ReasonCleanupFailed, "removing the proxy: %v", err)
			return ctrl.Result{RequeueAfter: kit.TailnetRetry}, nil
		}
		return ctrl.Result{}, err
	}
	if !done {
		return ctrl.Result{RequeueAfter: kit.CleanupPoll}, nil
	}
	return kit.Unserved(ctx, r.Client, r.Reporter, ing, kit.FinalizerName, func(ctx context.Context) error {
		return setIngressLoadBalancer(ctx, r.Client, ing, nil)
	})
}

// SetupWithManager watches Ingresses, their proxies' children, backend Services and their
// EndpointSlices, and ProxyClasses.
func (r *IngressReconciler) SetupWithManager(mgr ctrl.Manager, p *proxies.Proxies) error {
	r.proxies = p
	children := handler.EnqueueRequestsFromMapFunc(kit.ParentRequests(proxies.ParentTypeIngress))
	return ctrl.NewControllerManagedBy(mgr).
		For(&networkingv1.Ingress{}).
		Named("ingress").
		Watches(&appsv1.StatefulSet{}, children).
		Watches(&corev1.Secret{}, children).
		WatchesRawSource(r.TLSSecrets.Source(ingressesForTLSSecret(r.Client, r.serves))).
		WatchesRawSource(r.BackendCAs.Source(ingressesForBackendCA(r.Client, r.serves))).
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

func (r *IngressReconciler) ingressesForProxyClass(ctx context.Context, o client.Object) []reconcile.Request {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	return ingressRequests(list.Items, func(ing *networkingv1.Ingress) bool {
		return r.serves(ing) && proxies.ProxyClassOf(ing, r.Settings.DefaultProxyClass) == o.GetName()
	})
}
