// Package proxygroup holds the ProxyGroup reconciler: the replicas' StatefulSet, Secrets, auth
// keys and RBAC, scaling, and the group's status from what its replicas report. What the
// replicas serve comes from the group store, written by the Ingress and Service reconcilers.
package proxygroup

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// Names of a ProxyGroup's children.
const (
	secretTypeConfig = "config"
)

// ProxyGroupReconciler runs the replicas of ingress ProxyGroups.
type ProxyGroupReconciler struct {
	client.Client
	kit.Reporter
	Settings kit.Settings
	Tailnet  tailnet.Client
	// API reads uncached: the replicas' Secrets before an auth key is minted or a device
	// deleted, which the cache may show as they were before a write.
	API client.Reader
	// Store reads the group's documents and what its replicas report.
	Store groupstore.Store
	// documentsRead holds the groups whose replicas all read their services from the
	// documents (config v4 on), as the last pass found.
	documentsRead sync.Map
}

// +kubebuilder:rbac:groups=tailscale.com,resources=proxygroups,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=tailscale.com,resources=proxygroups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",namespace=system,resources=configmaps,verbs=get;list;watch;create;update;patch;delete

func (r *ProxyGroupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	pg := &tsv1alpha1.ProxyGroup{}
	if err := r.Get(ctx, req.NamespacedName, pg); err != nil {
		if apierrors.IsNotFound(err) {
			r.Forget(req.NamespacedName)
			r.documentsRead.LoadAndDelete(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	g := proxies.Group{Name: pg.Name}
	if pg.DeletionTimestamp != nil {
		return r.delete(ctx, pg, g)
	}
	defer func() { r.Settle(pg, err == nil) }()
	if err := kit.AddFinalizer(ctx, r.Client, pg, kit.FinalizerName); err != nil {
		return ctrl.Result{}, fmt.Errorf("adding the finalizer to ProxyGroup %s: %w", pg.Name, err)
	}
	// Past the maximum the group stays as it is: the replicas it has are all there are to read.
	limit := r.Settings.GroupReplicasLimit()
	reps, err := r.Store.Replicas(ctx, g, min(proxies.Replicas(pg), limit))
	if err != nil {
		return ctrl.Result{}, err
	}
	devices := replicaDevices(reps)
	for i, rep := range reps {
		if f := proxies.LoginNeeded(fmt.Sprintf("%s-%d", pg.Name, i), rep.State); f != nil {
			r.Findings(pg, []kit.Finding{*f})
		}
	}
	r.documentsRead.Store(pg.Name, !slices.ContainsFunc(reps, needsServiceList))
	scope := groupScope{replicas: proxies.Replicas(pg), devices: devices}
	// The status, from what this pass found, is written once whatever it then fails on.
	defer func() {
		before := pg.DeepCopy()
		pg.Status = groupStatus(pg.Status, scope, pg.Generation)
		if perr := kit.PatchStatus(ctx, r.Client, before, pg); perr != nil && err == nil {
			err = fmt.Errorf("writing ProxyGroup status: %w", perr)
		}
	}()
	for _, d := range devices {
		r.Progress(pg, "joined "+d.Hostname, kit.ReasonDeviceJoined, "a replica joined the tailnet as %s", d.Hostname)
	}

	if msg := groupRefusal(pg, limit); msg != "" {
		r.Warning(pg, kit.ReasonProxyGroupInvalid, "%s", msg)
		scope.fail(kit.ReasonProxyGroupInvalid, msg)
		return ctrl.Result{}, nil
	}
	class, err := proxies.ResolveProxyClass(ctx, r.Client, pg, r.Settings.DefaultProxyClass)
	if err != nil {
		return ctrl.Result{}, err
	}
	if class.NotReady != "" {
		scope.fail(kit.ReasonProxyGroupPending, class.NotReady+"; waiting for it")
		return ctrl.Result{}, nil
	}
	if err := r.ensure(ctx, pg, g, class.Ready(), reps); err != nil {
		scope.fail(kit.ReasonProxyGroupFailed, err.Error())
		if tailnet.ReasonOf(err) != "" {
			return r.TailnetFailure(pg, err)
		}
		return ctrl.Result{}, err
	}
	if err := r.scaleDown(ctx, pg, g, proxies.Replicas(pg)); err != nil {
		return r.TailnetFailure(pg, err)
	}
	if len(devices) == proxies.Replicas(pg) {
		r.Progress(pg, "ready", kit.ReasonProxyGroupReady, "%d/%d replicas up on the tailnet", len(devices), proxies.Replicas(pg))
	}
	return ctrl.Result{}, nil
}

// groupRefusal says why this operator leaves a group as it is, "" when it serves it: a type it
// does not run, another tailnet, more replicas than limit.
func groupRefusal(pg *tsv1alpha1.ProxyGroup, limit int) string {
	switch n := proxies.Replicas(pg); {
	case pg.Spec.Type != tsv1alpha1.ProxyGroupTypeIngress:
		return fmt.Sprintf("type %q is not served by this operator; only ingress ProxyGroups are", pg.Spec.Type)
	case pg.Spec.Tailnet != "":
		return fmt.Sprintf("spec.tailnet %q: joining another tailnet with a Tailnet object's credentials is not served by this operator, "+
			"which serves its own tailnet only; the group is left as it is", pg.Spec.Tailnet)
	case n > limit:
		return fmt.Sprintf("replicas %d is over this operator's maximum of %d (--max-proxygroup-replicas): each replica is a tailnet "+
			"device with an auth key of its own; the group is left as it is", n, limit)
	}
	return ""
}

// ensure applies the group's children: RBAC, the ConfigMap, per-replica Secrets and the
// StatefulSet.
func (r *ProxyGroupReconciler) ensure(ctx context.Context, pg *tsv1alpha1.ProxyGroup, g proxies.Group, class *tsv1alpha1.ProxyClass, reps []proxies.Replica) error {
	ns := r.Settings.Namespace
	n := proxies.Replicas(pg)
	// Only a replica that reads configs older than v4 needs the list of services, which grows
	// with the group: decoding every document for it costs as much.
	layout, err := r.Store.Layout(ctx, g, slices.ContainsFunc(reps, needsServiceList))
	if err != nil {
		return err
	}
	services, shards := layout.Services, layout.Shards
	// Metadata only: the HA Ingress and Service reconcilers own its documents and its other
	// shards.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: g.ConfigMap(), Namespace: ns, Labels: g.Labels()}}
	certs, err := r.certSecretNames(ctx, g)
	if err != nil {
		return err
	}
	w := proxies.WhereFor(r.Settings)
	var objs []client.Object
	for _, podNS := range w.Pods {
		objs = append(objs, r.buildServiceAccount(g, podNS))
	}
	objs = append(objs, r.buildRole(g, n, shards, certs), r.buildRoleBinding(g, w), cm)
	grants := map[string]proxies.KeyGrant{} // by config Secret
	for i := range n {
		config := r.secret(g, g.Replicas().ConfigSecret(i), secretTypeConfig, i, nil)
		if err := controllerutil.SetControllerReference(pg, config, r.Scheme()); err != nil {
			return fmt.Errorf("setting ProxyGroup %s as the owner of %s: %w", pg.Name, config.Name, err)
		}
		cfg, grant, err := r.replicaConfig(ctx, pg, g, class, i, services, config)
		if err != nil {
			return err
		}
		if config.Data, err = contract.ProxyConfigs.EncodeFrom(cfg, configReads(reps[i])); err != nil {
			return fmt.Errorf("encoding the config of replica %d of ProxyGroup %s: %w", i, pg.Name, err)
		}
		grant.Annotate(config)
		grants[config.Name] = grant
		objs = append(objs, config, r.secret(g, g.Replicas().StateSecret(i), proxies.SecretTypeState, i, nil))
		objs = append(objs, r.reportSecrets(g, i, shards)...)
	}
	kernel, err := r.servesL3(ctx, pg)
	if err != nil {
		return err
	}
	args := []string{"--config-secret=$(POD_NAME)-config", "--group-configmap=" + g.ConfigMap()}
	if !kernel {
		args = append(args, "--group-l7-only")
	}
	pods := proxies.ProxyPods{
		Name:           g.Name,
		Namespace:      r.Settings.PodNamespace(kernel),
		StateNamespace: ns,
		Labels:         g.Labels(),
		Selector:       g.Labels(),
		Replicas:       int32(n),
		Args:           args,
		Kernel:         kernel,
		Image:          r.Settings.ProxyImage,
		CaBundle:       r.Settings.ProxyCAConfigMap,
		NoLogs:         r.Settings.ProxyNoLogs,
		Class:          class,
	}.Build()
	for _, obj := range append(objs, pods) {
		if err := controllerutil.SetControllerReference(pg, obj, r.Scheme()); err != nil {
			return fmt.Errorf("setting ProxyGroup %s as the owner of %s: %w", pg.Name, obj.GetName(), err)
		}
	}
	// A group has some thirty children, applied on every change of its documents: in turn,
	// with a busy API server, that took seconds, which every new service waited for in the
	// replicas' config. The Pods come after what they read.
	var applies errgroup.Group
	applies.SetLimit(childApplies)
	for _, obj := range objs {
		applies.Go(func() error {
			err := kit.Apply(ctx, r.Client, obj)
			if grant, ok := grants[obj.GetName()]; ok && err != nil {
				return r.keys().Undelivered(ctx, grant, err)
			}
			return err
		})
	}
	if cm, err := proxies.CABundleCopy(ctx, r.Client, r.Settings, pods.Namespace); err != nil {
		return err
	} else if cm != nil {
		applies.Go(func() error { return kit.Apply(ctx, r.Client, cm) })
	}
	if err := applies.Wait(); err != nil {
		return err
	}
	if _, err := proxies.Place(ctx, r.Client, w, pods); err != nil {
		return err
	}
	return proxies.PlaceMetricsObjects(ctx, r.Client, pg, w, g.Name, pods.Namespace, g.Labels(), g.Labels(), class)
}

// servesL3 reports whether a Service is put on the group: its replicas then need the kernel
// data path (root, NET_ADMIN, a TUN device, forwarding turned on), and a group of Ingresses
// alone runs unprivileged, as a standalone Ingress's proxy does. The first Service put on a
// group rolls its replicas onto the kernel path, and the last one taken off rolls them back.
func (r *ProxyGroupReconciler) servesL3(ctx context.Context, pg *tsv1alpha1.ProxyGroup) (bool, error) {
	// Only whether there is one: no copy of each Service on every pass over the group.
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list, client.MatchingFields{groupstore.IndexServiceGroup: pg.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return false, fmt.Errorf("listing the Services on ProxyGroup %s: %w", pg.Name, err)
	}
	return len(list.Items) > 0, nil
}

// childApplies is how many of a group's children are applied at once.
const childApplies = 8

func (r *ProxyGroupReconciler) keys() proxies.Keys {
	return proxies.Keys{Client: r.Client, API: r.API, Tailnet: r.Tailnet, Namespace: r.Settings.Namespace}
}

// replicaConfig builds replica i's config, with the auth key its config Secret (config, without
// data) is to deliver.
func (r *ProxyGroupReconciler) replicaConfig(ctx context.Context, pg *tsv1alpha1.ProxyGroup, g proxies.Group, class *tsv1alpha1.ProxyClass, i int, services []string, config *corev1.Secret) (*contract.ProxyConfig, proxies.KeyGrant, error) {
	tags := make([]string, 0, len(pg.Spec.Tags))
	for _, t := range pg.Spec.Tags {
		tags = append(tags, string(t))
	}
	if len(tags) == 0 {
		tags = r.Settings.DefaultTags
	}
	prefix := pg.Spec.HostnamePrefix
	if prefix == "" {
		prefix = pg.Name
	}
	cfg := &contract.ProxyConfig{
		Kind:              contract.KindProxyGroup,
		Hostname:          fmt.Sprintf("%s-%d", prefix, i),
		Tags:              tags,
		ControlURL:        r.Settings.ControlURL,
		StateSecret:       g.Replicas().StateSecret(i),
		Firewall:          contract.FirewallConfig{Mode: r.Settings.FirewallMode},
		TLS:               contract.TLSConfig{CertShareMode: contract.CertReader},
		AdvertiseServices: services,
	}
	// Only the first replica talks to the CA, so a group costs one certificate per name.
	if i == 0 {
		cfg.TLS.CertShareMode = contract.CertIssuer
	}
	cfg.TLS.ACMEDirectoryURL = proxies.ACMEDirectory(r.Settings, class)
	if class != nil {
		if class.Spec.Tailscale != nil {
			cfg.AcceptRoutes = class.Spec.Tailscale.AcceptRoutes
		}
	}
	cfg.Metrics = proxies.MetricsEnabled(class)
	// One single-use key per replica.
	req := tailnet.AuthKeyRequest{Tags: tags, Description: fmt.Sprintf("tsingress proxygroup %s replica %d", pg.Name, i), Expiry: proxies.AuthKeyExpiry}
	identity := r.buildServiceAccount(g, r.Settings.Namespace)
	if err := controllerutil.SetControllerReference(pg, identity, r.Scheme()); err != nil {
		return nil, proxies.KeyGrant{}, fmt.Errorf("setting ProxyGroup %s as the owner of %s: %w", pg.Name, identity.Name, err)
	}
	grant, err := r.keys().Grant(ctx, g.Replicas(), i, config, identity, cfg.Hostname, req)
	if err != nil {
		return nil, proxies.KeyGrant{}, err
	}
	cfg.AuthKey = grant.Key
	return cfg, grant, nil
}

func (r *ProxyGroupReconciler) secret(g proxies.Group, name, typ string, i int, data map[string][]byte) *corev1.Secret {
	labels := g.Labels()
	labels[kit.LabelSecretType] = typ
	labels[proxies.LabelReplica] = strconv.Itoa(i)
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Settings.Namespace, Labels: labels}, Data: data}
}

// buildServiceAccount is the replicas' ServiceAccount in ns, one of the namespaces they may
// run in; the operator's namespace's also keeps the mint records.
func (r *ProxyGroupReconciler) buildServiceAccount(g proxies.Group, ns string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: ns, Labels: g.Labels()}}
}

// buildRole lets the replicas read their configs and the group ConfigMap, and write their
// state Secrets; nothing else.
// groupCertSecrets names a group's certificate Secrets: shared ones that the issuing replica
// writes, and copies of bring-your-own certificates that replicas only read.
type groupCertSecrets struct{ shared, byo []string }

func (r *ProxyGroupReconciler) certSecretNames(ctx context.Context, g proxies.Group) (groupCertSecrets, error) {
	var out groupCertSecrets
	for typ, dst := range map[string]*[]string{certs.SecretTypeGroupCert: &out.shared, certs.SecretTypeCertCopy: &out.byo} {
		list := &corev1.SecretList{}
		// Only their names: the cache's objects, not copies of thousands of certificates.
		if err := r.List(ctx, list, append(groupstore.GroupSecrets(r.Settings.Namespace, g, typ), client.UnsafeDisableDeepCopy)...); err != nil {
			return out, fmt.Errorf("listing the %s Secrets of ProxyGroup %s: %w", typ, g.Name, err)
		}
		for _, s := range list.Items {
			*dst = append(*dst, s.Name)
		}
		slices.Sort(*dst)
	}
	return out, nil
}

// buildRole lets replicas read the group's ConfigMaps (its shards) and their Secrets, write
// their state, and read (the issuer: write) the group's certificate Secrets.
func (r *ProxyGroupReconciler) buildRole(g proxies.Group, n, shards int, certs groupCertSecrets) *rbacv1.Role {
	var secrets, configMaps []string
	for i := range n {
		secrets = append(secrets, g.Replicas().ConfigSecret(i), g.Replicas().StateSecret(i))
		secrets = append(secrets, proxies.ReportSecretNames(g, i, shards)...)
	}
	for i := range max(shards, 1) {
		configMaps = append(configMaps, contract.ShardName(g.ConfigMap(), i))
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: configMaps, Verbs: []string{"get", "list", "watch"}},
	}
	if len(secrets) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: secrets,
			Verbs: []string{"get", "list", "watch", "patch"}})
	}
	if len(certs.shared) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: certs.shared,
			Verbs: []string{"get", "list", "watch", "update", "patch"}})
	}
	if len(certs.byo) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: certs.byo,
			Verbs: []string{"get", "list", "watch"}})
	}
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: r.Settings.Namespace, Labels: g.Labels()}, Rules: rules}
}

// buildRoleBinding binds the group's Role to its ServiceAccount in every namespace its
// replicas may run in: they move when a Service is put on the group or taken off.
func (r *ProxyGroupReconciler) buildRoleBinding(g proxies.Group, w proxies.Where) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: r.Settings.Namespace, Labels: g.Labels()},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: g.Name},
		Subjects:   proxies.ServiceAccountSubjects(g.Name, w.Pods),
	}
}

// replicaSecrets lists a group's per-replica Secrets by ordinal.
func (r *ProxyGroupReconciler) replicaSecrets(ctx context.Context, g proxies.Group, typ string) (map[int]*corev1.Secret, error) {
	list := &corev1.SecretList{}
	if err := r.List(ctx, list, groupstore.GroupSecrets(r.Settings.Namespace, g, typ)...); err != nil {
		return nil, fmt.Errorf("listing the %s Secrets of ProxyGroup %s: %w", typ, g.Name, err)
	}
	out := map[int]*corev1.Secret{}
	for i := range list.Items {
		if n, err := strconv.Atoi(list.Items[i].Labels[proxies.LabelReplica]); err == nil {
			out[n] = &list.Items[i]
		}
	}
	return out, nil
}

// scaleDown removes the devices and Secrets of replicas at or above n. A device the tailnet API
// does not show to be the replica's stays, with a Warning Event on pg.
func (r *ProxyGroupReconciler) scaleDown(ctx context.Context, pg *tsv1alpha1.ProxyGroup, g proxies.Group, n int) error {
	states, err := r.replicaSecrets(ctx, g, proxies.SecretTypeState)
	if err != nil {
		return err
	}
	configs, err := r.replicaSecrets(ctx, g, secretTypeConfig)
	if err != nil {
		return err
	}
	for i, s := range states {
		if i < n {
			continue
		}
		// From the API server, not the cache: a device recorded just before must not be missed.
		if err := r.API.Get(ctx, client.ObjectKeyFromObject(s), s); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("reading the state Secret %s/%s of removed replica %d: %w", s.Namespace, s.Name, i, err)
		}
		refused, err := r.keys().DeleteDevice(ctx, g.Replicas(), i, s)
		if err != nil {
			return err
		}
		if refused != "" {
			r.Warning(pg, kit.ReasonDeviceNotMinted, "%s", refused)
		}
		if err := kit.Remove(ctx, r.Client, s); err != nil {
			return fmt.Errorf("deleting the state Secret %s/%s of removed replica %d: %w", s.Namespace, s.Name, i, err)
		}
	}
	for i, s := range configs {
		if i >= n {
			if err := r.API.Get(ctx, client.ObjectKeyFromObject(s), s); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("reading the config Secret %s/%s of removed replica %d: %w", s.Namespace, s.Name, i, err)
			}
			if err := r.keys().Release(ctx, s); err != nil {
				return err
			}
			if err := kit.Remove(ctx, r.Client, s); err != nil {
				return fmt.Errorf("deleting the config Secret %s/%s of removed replica %d: %w", s.Namespace, s.Name, i, err)
			}
		}
	}
	return r.removeReportSecrets(ctx, g, n)
}

// delete removes every replica's device; the children go with the ProxyGroup through their
// owner references.
func (r *ProxyGroupReconciler) delete(ctx context.Context, pg *tsv1alpha1.ProxyGroup, g proxies.Group) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(pg, kit.FinalizerName) {
		r.Forget(client.ObjectKeyFromObject(pg))
		return ctrl.Result{}, nil
	}
	if err := r.scaleDown(ctx, pg, g, 0); err != nil {
		return r.TailnetFailure(pg, err)
	}
	if err := kit.RemoveFinalizer(ctx, r.Client, pg, kit.FinalizerName); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing the finalizer from ProxyGroup %s: %w", pg.Name, err)
	}
	r.Forget(client.ObjectKeyFromObject(pg))
	return ctrl.Result{}, nil
}

// replicaDevices lists the replicas up on the tailnet.
func replicaDevices(reps []proxies.Replica) []tsv1alpha1.TailnetDevice {
	var devices []tsv1alpha1.TailnetDevice
	for _, rep := range reps {
		if st := rep.State; st != nil && st.FQDN != "" {
			devices = append(devices, tsv1alpha1.TailnetDevice{Hostname: st.FQDN, TailnetIPs: st.TailnetIPs})
		}
	}
	return devices
}

// needsServiceList says whether a replica may read a config before v4, which lists its services.
func needsServiceList(rep proxies.Replica) bool { return configReads(rep) < 4 }

// configReads is the config version a replica's running proxy reported it reads, 0 while it
// has not: its config is then written in every version an older proxy might need (a Pod
// replaced with an older image reads an older one).
func configReads(rep proxies.Replica) int {
	if rep.State == nil {
		return 0
	}
	return rep.State.ConfigVersion
}

// groupScope is what one pass found about a ProxyGroup: its replicas up on the tailnet, and
// why the group cannot be ready whatever they do (empty when nothing stops it).
type groupScope struct {
	replicas                int
	devices                 []tsv1alpha1.TailnetDevice
	failReason, failMessage string
}

func (s *groupScope) fail(reason, msg string) {
	s.failReason, s.failMessage = reason, msg
}

// groupStatus computes a ProxyGroup's status from a pass's scope. The reconciler owns all of
// it: ProxyGroupReady, ProxyGroupAvailable and the devices. Available follows the replicas
// only, as they keep serving whatever else fails.
func groupStatus(status tsv1alpha1.ProxyGroupStatus, s groupScope, gen int64) tsv1alpha1.ProxyGroupStatus {
	status = *status.DeepCopy()
	up := len(s.devices)
	counts := fmt.Sprintf("%d/%d replicas up on the tailnet", up, s.replicas)
	switch {
	case s.failReason != "":
		kit.SetCondition(&status.Conditions, tsv1alpha1.ProxyGroupReady, false, s.failReason, s.failMessage, gen)
	case up == s.replicas:
		kit.SetCondition(&status.Conditions, tsv1alpha1.ProxyGroupReady, true, kit.ReasonProxyGroupReady, counts, gen)
	default:
		kit.SetCondition(&status.Conditions, tsv1alpha1.ProxyGroupReady, false, kit.ReasonProxyGroupCreating, counts, gen)
	}
	if up > 0 {
		kit.SetCondition(&status.Conditions, tsv1alpha1.ProxyGroupAvailable, true, kit.ReasonProxyGroupAvailable, counts, gen)
	} else {
		kit.SetCondition(&status.Conditions, tsv1alpha1.ProxyGroupAvailable, false, kit.ReasonProxyGroupNoReplicas, counts, gen)
	}
	status.Devices = s.devices
	return status
}

// SetupWithManager watches ProxyGroups, their children and ProxyClasses.
func (r *ProxyGroupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	toGroup := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		l := o.GetLabels()
		if l[kit.LabelManaged] != "true" || l[kit.LabelParentType] != proxies.ParentTypeProxyGroup {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: l[kit.LabelParentName]}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&tsv1alpha1.ProxyGroup{}).
		Named("proxygroup").
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Secret{}, builder.WithPredicates(contentWrites())).
		Owns(&corev1.ConfigMap{}, builder.WithPredicates(r.documentWrites())).
		Watches(&corev1.Pod{}, toGroup).
		Watches(&tsv1alpha1.ProxyClass{}, handler.EnqueueRequestsFromMapFunc(r.groupsForProxyClass)).
		Watches(&corev1.Service{}, servicesOnGroups()).
		Complete(r)
}

// servicesOnGroups enqueues the groups a Service is put on or taken off, whose replicas need
// the kernel data path while one is on (servesL3); its other changes do not matter here.
func servicesOnGroups() handler.Funcs {
	enqueue := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		for _, o := range objs {
			if name := o.GetAnnotations()[kit.AnnotationProxyGroup]; name != "" {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(q, e.Object)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetAnnotations()[kit.AnnotationProxyGroup] != e.ObjectNew.GetAnnotations()[kit.AnnotationProxyGroup] {
				enqueue(q, e.ObjectOld, e.ObjectNew)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(q, e.Object)
		},
	}
}

// contentWrites drops the writes of a group's Secrets that only the replicas fill when
// nothing the reconciler writes or reports follows from their data: the replicas' reports
// (in their state Secrets and the other shards), and the certificate Secrets, of which the
// Role needs only the names.
// With many objects on a group the replicas write them several times a second, and each pass
// lists every certificate Secret and applies some thirty children.
func contentWrites() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		metaChanged := !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
			!equality.Semantic.DeepEqual(e.ObjectOld.GetOwnerReferences(), e.ObjectNew.GetOwnerReferences()) ||
			e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		switch e.ObjectNew.GetLabels()[kit.LabelSecretType] {
		case proxies.SecretTypeReport, certs.SecretTypeGroupCert, certs.SecretTypeCertCopy:
			return metaChanged
		case proxies.SecretTypeState:
			// Its report's entries: the replica itself, its login and config version matter.
			old, okOld := e.ObjectOld.(*corev1.Secret)
			cur, okCur := e.ObjectNew.(*corev1.Secret)
			return metaChanged || !okOld || !okCur || !contract.SameButEntries(old.Data, cur.Data)
		}
		return true
	}}
}

// documentWrites drops the writes of a group's documents when nothing the reconciler writes
// follows from them: its replicas read their services from the documents, so only the shard
// count (their Role, their report Secrets) and the ConfigMaps' metadata matter. With many
// objects on a group the documents change several times a second, and each pass applies
// some thirty children.
func (r *ProxyGroupReconciler) documentWrites() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(*corev1.ConfigMap)
		cur, okCur := e.ObjectNew.(*corev1.ConfigMap)
		if !okOld || !okCur {
			return true
		}
		if read, _ := r.documentsRead.Load(cur.Labels[kit.LabelParentName]); read != true {
			return true
		}
		oldCount, oldErr := contract.ShardCountOf(old.Data)
		curCount, curErr := contract.ShardCountOf(cur.Data)
		return oldCount != curCount || (oldErr == nil) != (curErr == nil) ||
			!maps.Equal(old.Labels, cur.Labels) || !equality.Semantic.DeepEqual(old.OwnerReferences, cur.OwnerReferences)
	}}
}

func (r *ProxyGroupReconciler) groupsForProxyClass(ctx context.Context, o client.Object) []reconcile.Request {
	list := &tsv1alpha1.ProxyGroupList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, pg := range list.Items {
		if proxies.ProxyClassOf(&pg, r.Settings.DefaultProxyClass) == o.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: pg.Name}})
		}
	}
	return reqs
}

// reportSecrets are replica i's report Secrets, empty: the replica writes them.
func (r *ProxyGroupReconciler) reportSecrets(g proxies.Group, i, shards int) []client.Object {
	var objs []client.Object
	for _, name := range proxies.ReportSecretNames(g, i, shards) {
		objs = append(objs, r.secret(g, name, proxies.SecretTypeReport, i, nil))
	}
	return objs
}

// removeReportSecrets removes the report Secrets of replicas at or above n.
func (r *ProxyGroupReconciler) removeReportSecrets(ctx context.Context, g proxies.Group, n int) error {
	list := &corev1.SecretList{}
	if err := r.List(ctx, list, groupstore.GroupSecrets(r.Settings.Namespace, g, proxies.SecretTypeReport)...); err != nil {
		return fmt.Errorf("listing the %s Secrets of ProxyGroup %s: %w", proxies.SecretTypeReport, g.Name, err)
	}
	for i := range list.Items {
		if ord, err := strconv.Atoi(list.Items[i].Labels[proxies.LabelReplica]); err == nil && ord >= n {
			if err := kit.Remove(ctx, r.Client, &list.Items[i]); err != nil {
				return fmt.Errorf("deleting the report Secret %s/%s of removed replica %d: %w", list.Items[i].Namespace, list.Items[i].Name, ord, err)
			}
		}
	}
	return nil
}
