package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// HAIngressReconciler serves Ingresses annotated tailscale.com/proxy-group through a
// ProxyGroup: one Tailscale Service each, in the group's Serve config.
type HAIngressReconciler struct {
	client.Client
	reporter
	Settings Settings
	docs     groupDocs
	services *tailscaleServices
	certs    certSecrets
	guard    *certGuard
	// tlsSecrets sees users' TLS Secrets change.
	tlsSecrets *tlsSecretWatch
	info       func(context.Context) tailnet.TailnetInfo
}

func (r *HAIngressReconciler) serves(ing *networkingv1.Ingress) bool {
	return ing.DeletionTimestamp == nil &&
		ing.Spec.IngressClassName != nil && *ing.Spec.IngressClassName == r.Settings.IngressClassName &&
		ing.Annotations[AnnotationProxyGroup] != ""
}

func (r *HAIngressReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	ing := &networkingv1.Ingress{}
	if err := r.Get(ctx, req.NamespacedName, ing); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	s := &haIngressScope{ing: ing, hostname: ingressHostname(ing)}
	s.svcName = "svc:" + s.hostname
	if !r.serves(ing) {
		return r.unserve(ctx, ing, s.svcName)
	}
	defer func() { r.settle(ing, err == nil) }()
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
	d := decideHAIngress(s, r.Settings.DefaultTags)
	r.findings(ing, d.findings)
	if hasBlocking(d.findings) {
		return ctrl.Result{}, nil
	}
	pg, ws := s.group, &d.ws
	if err := addFinalizer(ctx, r.Client, ing, FinalizerIngressPG); err != nil {
		return ctrl.Result{}, err
	}
	ports := []string{"tcp:443"}
	if ws.HTTP != contract.HTTPOff {
		ports = append(ports, "tcp:80")
	}
	ts, err := r.services.ensure(ctx, s.svcName, ports, d.tags)
	if err != nil {
		var notOurs errNotOurs
		if errors.As(err, &notOurs) {
			r.warning(ing, ReasonInvalidTailscaleSvc, "%v", err)
			return ctrl.Result{}, nil
		}
		return r.tailnetFailure(ing, err)
	}
	if ts.created {
		r.created(ing, ReasonTailscaleServiceCreated, "created Tailscale Service %s (%s) for ProxyGroup %s", s.svcName, addrList(ts.Addrs), pg.Name)
	}
	for _, c := range s.byo.copies {
		// Owned by the group, so that its Role is rebuilt to let replicas read the copy.
		if err := controllerutil.SetControllerReference(pg, c, r.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := apply(ctx, r.Client, c); err != nil {
			return ctrl.Result{}, err
		}
	}
	// Stale copies of this Ingress, on this group or one it left.
	if err := pruneCertCopies(ctx, r.Client, r.Settings.Namespace, map[string]string{labelIngress: hashLabel(ing.Namespace + "/" + ing.Name)}, s.byo.copies); err != nil {
		return ctrl.Result{}, err
	}
	if s.cert, err = r.certificate(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	r.certificateIssued(ing, s.cert, r.guard.now())
	ws.TLS.Hold = s.cert.hold
	owner, here := ownerOf("Ingress", ing), placement{uid: ing.UID, pg: pg.Name, svcName: s.svcName}
	if !r.docs.placedAt(owner, here) {
		if err := r.docs.removeElsewhere(ctx, s.svcName, pg.Name); err != nil {
			return ctrl.Result{}, err
		}
		if err := releaseOwned(ctx, r.docs, r.services, owner, s.svcName); err != nil {
			return r.tailnetFailure(ing, err)
		}
		r.docs.place(owner, here)
	}
	if err := r.docs.setServe(ctx, pg.Name, s.svcName, ws, owner); err != nil {
		return docsFailure(r.reporter, ing, err)
	}
	s.configured = ws
	if _, served := haIngressLoadBalancer(s.svcName, ws, s.cert, s.states, r.guard.now()); served {
		r.progress(ing, "serving", ReasonServing, "serving https://%s through Tailscale Service %s", s.cert.fqdn, s.svcName)
		if ws.Funnel {
			r.funnel(ing, s.cert.fqdn, groupTags(pg, r.Settings.DefaultTags), s.states)
		}
	}
	return ctrl.Result{RequeueAfter: sooner(s.cert.recheck(s.byo.recheck, r.guard.now()), ts.recheck)}, nil
}

// haIngressScope is what a pass over an Ingress on a ProxyGroup reads, and what it configured.
type haIngressScope struct {
	ing               *networkingv1.Ingress
	hostname, svcName string
	// group is the ProxyGroup named, or nil with groupFinding saying why it cannot serve.
	group        *tsv1alpha1.ProxyGroup
	groupFinding *finding
	// takenBy is another Ingress that already serves the hostname on a ProxyGroup.
	takenBy string
	domain  string
	routes  routeInputs
	byo     byoCertificates
	// states is what the group's replicas report, read once for the certificate and the status.
	states []*contract.ProxyState
	cert   tailnetCert
	// configured is what the group's document serves for the Ingress after this pass; nil
	// leaves the status as it was.
	configured *contract.WebService
}

func (r *HAIngressReconciler) gather(ctx context.Context, s *haIngressScope) error {
	var err error
	if s.group, s.groupFinding, err = resolveGroup(ctx, r.Client, s.ing.Annotations[AnnotationProxyGroup]); err != nil {
		return err
	}
	// An invalid hostname is decideIngress's finding; a valid one may be taken.
	if contract.ValidHostname(s.hostname) {
		if s.takenBy, err = r.hostnameTakenBy(ctx, s.ing, s.hostname); err != nil {
			return err
		}
	}
	s.domain = r.info(ctx).Domain
	if s.routes, err = gatherRouteInputs(ctx, r.Client, s.ing, s.domain); err != nil {
		return err
	}
	if s.group == nil {
		return nil
	}
	if s.byo, err = r.certs.resolve(ctx, s.ing, s.group.Name, r.Settings.Namespace, byoLabels(s.group, s.ing)); err != nil {
		return err
	}
	s.states, err = groupStates(ctx, r.Client, r.Settings.Namespace, s.group)
	return err
}

// decideHAIngress decides what an Ingress asks its ProxyGroup to serve, and what stops it.
func decideHAIngress(s *haIngressScope, defaultTags []string) ingressDecision {
	var findings []finding
	if s.groupFinding != nil {
		findings = append(findings, *s.groupFinding)
	}
	if s.takenBy != "" {
		findings = append(findings, blockf(ReasonDuplicateHostname, "Ingress %s already serves %s on a ProxyGroup; hostnames must be unique", s.takenBy, s.hostname))
	}
	d := decideIngress(s.ing, s.routes, s.byo, defaultTags)
	d.findings = append(findings, d.findings...)
	return d
}

// loadBalancer is the Ingress's status.loadBalancer.ingress once the pass configured its group
// (decided false: leave it as it was), with Funnel's port error.
func (s *haIngressScope) loadBalancer(now time.Time) (lb []networkingv1.IngressLoadBalancerIngress, decided bool) {
	if s.configured == nil {
		return nil, false
	}
	lb, served := haIngressLoadBalancer(s.svcName, s.configured, s.cert, s.states, now)
	if s.configured.Funnel && served {
		setFunnelPortError(lb, s.cert.fqdn, s.states)
	}
	return lb, true
}

// byoLabels mark the copies of one Ingress's certificates on a ProxyGroup: the group's labels,
// so that its Role lists them, and the Ingress's, so that they are pruned per Ingress.
func byoLabels(pg *tsv1alpha1.ProxyGroup, ing *networkingv1.Ingress) map[string]string {
	l := group{pg.Name}.labels()
	l[labelIngress] = hashLabel(ing.Namespace + "/" + ing.Name)
	return l
}

// certificate prepares the group's certificate Secret of the Ingress's tailnet name, records
// what the replicas obtained and decides whether the issuing replica may ask the CA.
func (r *HAIngressReconciler) certificate(ctx context.Context, s *haIngressScope) (tailnetCert, error) {
	c := tailnetCert{}
	pg := s.group
	class, err := resolveProxyClass(ctx, r.Client, pg, r.Settings.DefaultProxyClass)
	if err != nil {
		return c, err
	}
	// The class the replicas are configured with: staging's limits are for testing, no guard then.
	staging := class.staging()
	domain := s.domain
	for _, st := range s.states {
		if st == nil {
			continue
		}
		if _, d, ok := strings.Cut(st.FQDN, "."); ok {
			domain = d
		}
		if err := r.guard.observeReport(ctx, st, staging); err != nil {
			return c, err
		}
	}
	if domain != "" {
		c.fqdn = s.hostname + "." + domain
		if err := r.ensureGroupCertSecret(ctx, pg, c.fqdn); err != nil {
			return c, err
		}
	}
	if st := s.states[0]; st != nil {
		c.cur = st.Certificates[c.fqdn]
	}
	return c, r.guard.decide(ctx, r.reporter, s.ing, &c, staging)
}

// ensureGroupCertSecret creates the empty kubernetes.io/tls Secret that the group's issuing
// replica fills. It belongs to the ProxyGroup, not the Ingress: an Ingress deleted and created
// again reuses the certificate instead of spending the CA's limits.
func (r *HAIngressReconciler) ensureGroupCertSecret(ctx context.Context, pg *tsv1alpha1.ProxyGroup, fqdn string) error {
	name := contract.GroupCertSecret(fqdn)
	s := &corev1.Secret{}
	// Whether it exists: the cache's object, not a copy of a certificate per pass.
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Settings.Namespace, Name: name}, s, client.UnsafeDisableDeepCopy)
	if !apierrors.IsNotFound(err) {
		return err
	}
	labels := group{pg.Name}.labels()
	labels[LabelSecretType] = secretTypeGroupCert
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Settings.Namespace, Labels: labels},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil},
	}
	if err := controllerutil.SetControllerReference(pg, s, r.Scheme()); err != nil {
		return err
	}
	return client.IgnoreAlreadyExists(create(ctx, r.Client, s))
}

// hostnameTakenBy returns another HA Ingress that serves hostname and came first.
func (r *HAIngressReconciler) hostnameTakenBy(ctx context.Context, ing *networkingv1.Ingress, hostname string) (string, error) {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list, client.MatchingFields{indexIngressHostname: hostname}); err != nil {
		return "", err
	}
	others := make([]*networkingv1.Ingress, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return takenBy(ing, others, func(o *networkingv1.Ingress) bool { return r.serves(o) && ingressHostname(o) == hostname }, FinalizerIngressPG), nil
}

// haIngressLoadBalancer is an Ingress's status.loadBalancer.ingress, which the reconciler owns
// while it serves the Ingress: the Tailscale Service's name once a replica advertises it (or,
// with a port error, why its certificate is missing) and the bring-your-own hosts served.
// served says whether the tailnet name is served.
func haIngressLoadBalancer(svcName string, ws *contract.WebService, cert tailnetCert, states []*contract.ProxyState, now time.Time) (lb []networkingv1.IngressLoadBalancerIngress, served bool) {
	advertising := firstAdvertising(states, svcName)
	if errReason := certPortError(cert.hold, cert.cur, now); errReason != "" && cert.fqdn != "" {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: cert.fqdn,
			Ports: []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP, Error: &errReason}}})
	} else if advertising != nil && cert.fqdn != "" {
		lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: cert.fqdn, Ports: httpsPorts(ws.HTTP != contract.HTTPOff)})
		served = true
	}
	if advertising != nil {
		lb = append(lb, byoStatus(ws.TLS.Certificates, advertising.Certificates, now)...)
	}
	return lb, served
}

func firstAdvertising(states []*contract.ProxyState, svcName string) *contract.ProxyState {
	for _, st := range states {
		if st != nil && advertises(st, svcName) {
			return st
		}
	}
	return nil
}

// unserve removes an Ingress's entry from every group and releases its Tailscale Service.
func (r *HAIngressReconciler) unserve(ctx context.Context, ing *networkingv1.Ingress, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ing, FinalizerIngressPG) {
		r.forget(client.ObjectKeyFromObject(ing))
		return ctrl.Result{}, nil
	}
	r.docs.unplace(ownerOf("Ingress", ing))
	if err := r.docs.removeElsewhere(ctx, svcName, ""); err != nil {
		return ctrl.Result{}, err
	}
	// Its certificate copies on whichever group it was on.
	byo := map[string]string{labelIngress: hashLabel(ing.Namespace + "/" + ing.Name)}
	if err := pruneCertCopies(ctx, r.Client, r.Settings.Namespace, byo, nil); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.services.release(ctx, svcName); err != nil {
		return r.tailnetFailure(ing, err)
	}
	if err := releaseOwned(ctx, r.docs, r.services, ownerOf("Ingress", ing), ""); err != nil {
		return r.tailnetFailure(ing, err)
	}
	if ing.DeletionTimestamp == nil {
		if err := setIngressLoadBalancer(ctx, r.Client, ing, nil); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := removeFinalizer(ctx, r.Client, ing, FinalizerIngressPG); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(ing))
	return ctrl.Result{}, nil
}

// SetupWithManager watches Ingresses, backend Services, ProxyGroups and their state Secrets.
func (r *HAIngressReconciler) SetupWithManager(mgr ctrl.Manager, docs groupDocs, services *tailscaleServices) error {
	r.docs, r.services = docs, services
	group := groupEvents{c: r.Client, docs: docs, kind: "Ingress", all: r.onGroup}.handler()
	return ctrl.NewControllerManagedBy(mgr).
		For(&networkingv1.Ingress{}, builder.WithPredicates(ownWrites(FinalizerIngressPG))).
		Named("ingress-proxygroup").
		WithOptions(haControllerOptions).
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
		WatchesRawSource(r.tlsSecrets.source(ingressesForTLSSecret(r.Client, r.serves))).
		Watches(&corev1.ConfigMap{}, group).
		Complete(r)
}

// onGroup lists the Ingresses served on a ProxyGroup.
func (r *HAIngressReconciler) onGroup(ctx context.Context, name string) []reconcile.Request {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list, client.MatchingFields{indexIngressGroup: name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	return ingressRequests(list.Items, r.serves)
}

// backendServices fetches the Services an Ingress routes to; missing ones are left out.
func backendServices(ctx context.Context, c client.Client, ing *networkingv1.Ingress) (map[string]*corev1.Service, error) {
	services := map[string]*corev1.Service{}
	for _, name := range backendServiceNames(ing) {
		svc := &corev1.Service{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: ing.Namespace, Name: name}, svc); {
		case err == nil:
			services[name] = svc
		case !apierrors.IsNotFound(err):
			return nil, err
		}
	}
	return services, nil
}

// setIngressLoadBalancer writes an Ingress's load-balancer status when it changed.
func setIngressLoadBalancer(ctx context.Context, c client.Client, ing *networkingv1.Ingress, want []networkingv1.IngressLoadBalancerIngress) error {
	if equality.Semantic.DeepEqual(ing.Status.LoadBalancer.Ingress, want) {
		return nil
	}
	before := ing.DeepCopy()
	ing.Status.LoadBalancer.Ingress = want
	return patchStatus(ctx, c, before, ing)
}
