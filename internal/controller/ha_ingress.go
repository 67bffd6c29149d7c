package controller

import (
	"context"
	"errors"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
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
	info     func(context.Context) tailnet.TailnetInfo
}

func (r *HAIngressReconciler) serves(ing *networkingv1.Ingress) bool {
	return ing.DeletionTimestamp == nil &&
		ing.Spec.IngressClassName != nil && *ing.Spec.IngressClassName == r.Settings.IngressClassName &&
		ing.Annotations[AnnotationProxyGroup] != ""
}

func (r *HAIngressReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ing := &networkingv1.Ingress{}
	if err := r.Get(ctx, req.NamespacedName, ing); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	hostname := ingressHostname(ing)
	svcName := "svc:" + hostname
	if !r.serves(ing) {
		return r.unserve(ctx, ing, svcName)
	}
	pg, f, err := resolveGroup(ctx, r.Client, ing.Annotations[AnnotationProxyGroup])
	if err != nil {
		return ctrl.Result{}, err
	}
	findings := []finding{}
	if f != nil {
		findings = append(findings, *f)
	}
	if !contract.ValidHostname(hostname) {
		findings = append(findings, warnf(ReasonInvalidHostname, "tailnet hostname %q (from the first TLS host) is not a valid DNS label", hostname))
	} else if other, err := r.hostnameTakenBy(ctx, ing, hostname); err != nil {
		return ctrl.Result{}, err
	} else if other != "" {
		findings = append(findings, warnf(ReasonDuplicateHostname, "Ingress %s already serves %s on a ProxyGroup; hostnames must be unique", other, hostname))
	}
	in, err := gatherRouteInputs(ctx, r.Client, ing, r.info(ctx).Domain)
	if err != nil {
		return ctrl.Result{}, err
	}
	ws, routeFindings := buildWebService(ing, in)
	findings = append(findings, routeFindings...)
	var byo byoCertificates
	if pg != nil {
		if byo, err = r.certs.resolve(ctx, ing, pg.Name, r.Settings.Namespace, byoLabels(pg, ing)); err != nil {
			return ctrl.Result{}, err
		}
		ws.TLS.Certificates = byo.refs
		findings = append(findings, byo.findings...)
	}
	tags, tf := parseTags(ing, r.Settings.DefaultTags)
	if tf != nil {
		findings = append(findings, *tf)
	}
	r.findings(ing, findings)
	if len(ws.Routes) == 0 {
		r.eventf(ing, corev1.EventTypeWarning, ReasonNoValidBackends, "no path of this Ingress can be served; nothing changed")
	}
	if len(ws.Routes) == 0 || tags == nil || hasBlocking(findings) {
		return ctrl.Result{}, nil
	}

	if err := addFinalizer(ctx, r.Client, ing, FinalizerIngressPG); err != nil {
		return ctrl.Result{}, err
	}
	ports := []string{"tcp:443"}
	if ws.HTTP != contract.HTTPOff {
		ports = append(ports, "tcp:80")
	}
	if _, err := r.services.ensure(ctx, svcName, ports, tags); err != nil {
		var notOurs errNotOurs
		if errors.As(err, &notOurs) {
			r.eventf(ing, corev1.EventTypeWarning, ReasonInvalidTailscaleSvc, "%v", err)
			return ctrl.Result{}, nil
		}
		return r.tailnetFailure(ing, err)
	}
	for _, c := range byo.copies {
		// Owned by the group, so that its Role is rebuilt to let replicas read the copy.
		if err := controllerutil.SetControllerReference(pg, c, r.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := apply(ctx, r.Client, c); err != nil {
			return ctrl.Result{}, err
		}
	}
	// Stale copies of this Ingress, on this group or one it left.
	if err := pruneCertCopies(ctx, r.Client, r.Settings.Namespace, map[string]string{labelIngress: hashLabel(ing.Namespace + "/" + ing.Name)}, byo.copies); err != nil {
		return ctrl.Result{}, err
	}
	// What the replicas report, read once for the certificate and the status.
	states, err := groupStates(ctx, r.Client, r.Settings.Namespace, pg)
	if err != nil {
		return ctrl.Result{}, err
	}
	cert, err := r.certificate(ctx, ing, pg, hostname, states)
	if err != nil {
		return ctrl.Result{}, err
	}
	ws.TLS.Hold = cert.hold
	if err := r.docs.removeElsewhere(ctx, svcName, pg.Name); err != nil {
		return ctrl.Result{}, err
	}
	if err := releaseOwned(ctx, r.docs, r.services, ownerOf("Ingress", ing), svcName); err != nil {
		return r.tailnetFailure(ing, err)
	}
	if err := r.docs.setServe(ctx, pg.Name, svcName, &ws, ownerOf("Ingress", ing)); err != nil {
		return r.docsFailure(ing, err)
	}
	if err := r.updateStatus(ctx, ing, svcName, &ws, cert, states); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: cert.recheck(byo.recheck, r.guard.now())}, nil
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
func (r *HAIngressReconciler) certificate(ctx context.Context, ing *networkingv1.Ingress, pg *tsv1alpha1.ProxyGroup, hostname string, states []*contract.ProxyState) (tailnetCert, error) {
	c := tailnetCert{}
	domain := r.info(ctx).Domain
	for _, st := range states {
		if st == nil {
			continue
		}
		if _, d, ok := strings.Cut(st.FQDN, "."); ok {
			domain = d
		}
		if err := r.guard.observe(ctx, st.Certificates); err != nil {
			return c, err
		}
	}
	if domain != "" {
		c.fqdn = hostname + "." + domain
		if err := r.ensureGroupCertSecret(ctx, pg, c.fqdn); err != nil {
			return c, err
		}
	}
	if st := states[0]; st != nil {
		c.cur = st.Certificates[c.fqdn]
	}
	staging, err := groupUsesStaging(ctx, r.Client, pg)
	if err != nil {
		return c, err
	}
	return c, r.guard.decide(ctx, r.reporter, ing, &c, staging)
}

// ensureGroupCertSecret creates the empty kubernetes.io/tls Secret that the group's issuing
// replica fills. It belongs to the ProxyGroup, not the Ingress: an Ingress deleted and created
// again reuses the certificate instead of spending the CA's limits.
func (r *HAIngressReconciler) ensureGroupCertSecret(ctx context.Context, pg *tsv1alpha1.ProxyGroup, fqdn string) error {
	name := contract.GroupCertSecret(fqdn)
	s := &corev1.Secret{}
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Settings.Namespace, Name: name}, s)
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
	return client.IgnoreAlreadyExists(r.Create(ctx, s))
}

// groupUsesStaging reports whether a group's ProxyClass picks Let's Encrypt's staging
// directory, whose limits are for testing: no guard then.
func groupUsesStaging(ctx context.Context, c client.Client, pg *tsv1alpha1.ProxyGroup) (bool, error) {
	if pg.Spec.ProxyClass == "" {
		return false, nil
	}
	pc := &tsv1alpha1.ProxyClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: pg.Spec.ProxyClass}, pc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return pc.Spec.UseLetsEncryptStagingEnvironment, nil
}

// hasBlocking reports whether a finding stops an object from being served, as opposed to a
// route that is merely skipped.
func hasBlocking(fs []finding) bool {
	for _, f := range fs {
		switch f.reason {
		case ReasonProxyGroupNotFound, ReasonProxyGroupWrongType, ReasonInvalidHostname, ReasonDuplicateHostname:
			return true
		}
	}
	return false
}

// docsFailure reports a group document that cannot be written.
func (r reporter) docsFailure(obj client.Object, err error) (ctrl.Result, error) {
	if errors.Is(err, errConfigFull) {
		r.eventf(obj, corev1.EventTypeWarning, ReasonConfigMapFull, "%v", err)
		return ctrl.Result{}, nil
	}
	if apierrors.IsNotFound(err) {
		// The ProxyGroup has not created its ConfigMap yet; its creation brings us back.
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

// hostnameTakenBy returns another HA Ingress that serves hostname and came first.
func (r *HAIngressReconciler) hostnameTakenBy(ctx context.Context, ing *networkingv1.Ingress, hostname string) (string, error) {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list); err != nil {
		return "", err
	}
	others := make([]*networkingv1.Ingress, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return takenBy(ing, others, func(o *networkingv1.Ingress) bool { return r.serves(o) && ingressHostname(o) == hostname }, FinalizerIngressPG), nil
}

// updateStatus lists the Tailscale Service's name once a replica advertises it (or, with a port
// error, why its certificate is missing) and the bring-your-own hosts served.
func (r *HAIngressReconciler) updateStatus(ctx context.Context, ing *networkingv1.Ingress, svcName string, ws *contract.WebService, cert tailnetCert, states []*contract.ProxyState) error {
	var want []networkingv1.IngressLoadBalancerIngress
	now := r.guard.now()
	advertising := firstAdvertising(states, svcName)
	if errReason := certPortError(cert.hold, cert.cur, now); errReason != "" && cert.fqdn != "" {
		want = append(want, networkingv1.IngressLoadBalancerIngress{Hostname: cert.fqdn,
			Ports: []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP, Error: &errReason}}})
	} else if advertising != nil && cert.fqdn != "" {
		want = append(want, networkingv1.IngressLoadBalancerIngress{Hostname: cert.fqdn, Ports: httpsPorts(ws.HTTP != contract.HTTPOff)})
	}
	if advertising != nil {
		want = append(want, byoStatus(ws.TLS.Certificates, advertising.Certificates, now)...)
	}
	return setIngressLoadBalancer(ctx, r.Client, ing, want)
}

func firstAdvertising(states []*contract.ProxyState, svcName string) *contract.ProxyState {
	for _, st := range states {
		if st != nil && slices.Contains(st.Advertised, svcName) {
			return st
		}
	}
	return nil
}

// unserve removes an Ingress's entry from every group and releases its Tailscale Service.
func (r *HAIngressReconciler) unserve(ctx context.Context, ing *networkingv1.Ingress, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ing, FinalizerIngressPG) {
		return ctrl.Result{}, nil
	}
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
	return ctrl.Result{}, removeFinalizer(ctx, r.Client, ing, FinalizerIngressPG)
}

// SetupWithManager watches Ingresses, backend Services, ProxyGroups and their state Secrets.
func (r *HAIngressReconciler) SetupWithManager(mgr ctrl.Manager, docs groupDocs, services *tailscaleServices) error {
	r.docs, r.services = docs, services
	return ctrl.NewControllerManagedBy(mgr).
		For(&networkingv1.Ingress{}).
		Named("ingress-proxygroup").
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			list := &networkingv1.IngressList{}
			if err := r.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressBackends: o.GetName()}); err != nil {
				return nil
			}
			return ingressRequests(list.Items, r.serves)
		})).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(ingressesForEndpointSlice(r.Client, r.serves))).
		Watches(&tsv1alpha1.ProxyGroup{}, handler.EnqueueRequestsFromMapFunc(r.forGroup)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.forGroup)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(ingressesForTLSSecret(r.Client, r.serves))).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.forGroup)).
		Complete(r)
}

// forGroup maps a ProxyGroup, or one of its Secrets or ConfigMaps, to the group's Ingresses.
func (r *HAIngressReconciler) forGroup(ctx context.Context, o client.Object) []reconcile.Request {
	name := groupOf(o)
	if name == "" {
		return nil
	}
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	return ingressRequests(list.Items, func(ing *networkingv1.Ingress) bool {
		return r.serves(ing) && ing.Annotations[AnnotationProxyGroup] == name
	})
}

// groupOf names the ProxyGroup of a ProxyGroup object or of one of its children.
func groupOf(o client.Object) string {
	if _, ok := o.(*tsv1alpha1.ProxyGroup); ok {
		return o.GetName()
	}
	l := o.GetLabels()
	if l[LabelManaged] == "true" && l[LabelParentType] == parentTypeProxyGroup {
		return l[LabelParentName]
	}
	return ""
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
	return c.Status().Patch(ctx, ing, client.MergeFrom(before))
}
