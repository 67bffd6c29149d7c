package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

const (
	benchGroup = "bench"
	appsNS     = "apps"
)

// scaleResult is what one N measured.
type scaleResult struct {
	n              int           // Ingresses, and as many Services
	applyTook      time.Duration // creating all of them, 8 at a time
	docs           time.Duration // last apply → every object in the group's documents
	status         time.Duration // last apply → every object's status set
	afterReport    time.Duration // the replicas' report of the last object → every status set
	cpu            time.Duration // the operator's CPU time from the first apply to the last status
	largestObject  int           // bytes of data of the largest ConfigMap or Secret in the operator's namespace
	largestName    string
	groupDocuments int    // bytes of every group document together
	failure        string // why it did not converge, if it did not
	limit          time.Duration
}

func (r scaleResult) cpuPerObject() time.Duration { return r.cpu / time.Duration(2*r.n) }

// measureScale puts n Ingresses and n Services on one ProxyGroup of 2 replicas, whose
// replicas are played by the bench: they report advertising whatever the documents hold.
func measureScale(ctx context.Context, operatorBin string, n int, logf func(string, ...any)) (scaleResult, error) {
	res := scaleResult{n: n}
	c, err := startCluster(ctx, operatorBin, fmt.Sprintf("/tmp/bench-operator-%d.log", n))
	if err != nil {
		return res, err
	}
	defer c.close()
	k := c.k8s
	pg := &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: benchGroup},
		Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To[int32](2)}}
	if err := k.Create(ctx, pg); err != nil {
		return res, err
	}
	pods := make([]*corev1.Pod, 2)
	if err := poll.Until(ctx, 2*time.Minute, 200*time.Millisecond, "replica Pods", func() error {
		for i := range pods {
			p := &corev1.Pod{}
			if err := k.Get(ctx, client.ObjectKey{Namespace: opNS, Name: fmt.Sprintf("%s-%d", benchGroup, i)}, p); err != nil {
				return err
			}
			pods[i] = p
		}
		_, err := readGroupDocs(ctx, k)
		return err
	}); err != nil {
		return res, err
	}
	kube, err := kubernetes.NewForConfig(c.cp.Config)
	if err != nil {
		return res, err
	}
	rep := &replicas{k8s: k, secrets: kube.CoreV1().Secrets(opNS), pods: pods}
	rctx, stopReplicas := context.WithCancel(ctx)
	defer stopReplicas()
	go rep.run(rctx)

	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appsNS}}); err != nil {
		return res, err
	}
	if err := k.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: appsNS, Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "web.example.test",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}); err != nil {
		return res, err
	}
	cpu0, err := c.cpuTime()
	if err != nil {
		return res, err
	}
	start := time.Now()
	prefix := networkingv1.PathTypePrefix
	if err := parallel(2*n, 8, func(i int) error {
		if i%2 == 0 {
			return k.Create(ctx, &networkingv1.Ingress{
				ObjectMeta: metav1.ObjectMeta{Namespace: appsNS, Name: fmt.Sprintf("site-%05d", i/2),
					Annotations: map[string]string{"tailscale.com/proxy-group": benchGroup}},
				Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("tailscale"),
					Rules: []networkingv1.IngressRule{{IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
						Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &prefix, Backend: networkingv1.IngressBackend{
							Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http"}}}}}}}}}},
			})
		}
		return k.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: appsNS, Name: fmt.Sprintf("db-%05d", i/2),
				Annotations: map[string]string{"tailscale.com/proxy-group": benchGroup, "tailscale.com/expose": "true"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: fmt.Sprintf("db-%05d.example.test", i/2),
				Ports: []corev1.ServicePort{{Name: "pg", Port: 5432}}},
		})
	}); err != nil {
		return res, err
	}
	lastApply := time.Now()
	res.applyTook = lastApply.Sub(start)
	logf("N=%d: applied %d objects in %s", n, 2*n, res.applyTook.Round(time.Millisecond))

	timeout := 2*time.Minute + time.Duration(n)*300*time.Millisecond
	res.limit = timeout
	var docsDone time.Time
	err = poll.Until(ctx, timeout, 250*time.Millisecond, "every object configured", func() error {
		if docsDone.IsZero() {
			d, err := readGroupDocs(ctx, k)
			if err != nil {
				return err
			}
			if got := len(d.names()); got < 2*n {
				return fmt.Errorf("%d of %d objects in the documents", got, 2*n)
			}
			docsDone = time.Now()
			logf("N=%d: every object in the documents %s after the last apply", n, docsDone.Sub(lastApply).Round(time.Millisecond))
		}
		ings, svcs, err := configured(ctx, k)
		if err != nil {
			return err
		}
		if ings < n || svcs < n {
			return fmt.Errorf("status set on %d of %d Ingresses and %d of %d Services", ings, n, svcs, n)
		}
		return nil
	})
	done := time.Now()
	if err != nil {
		res.failure = err.Error()
		return res, err
	}
	cpu1, err := c.cpuTime()
	if err != nil {
		return res, err
	}
	res.docs, res.status, res.cpu = docsDone.Sub(lastApply), done.Sub(lastApply), cpu1-cpu0
	res.afterReport = done.Sub(rep.reportedAll(2 * n))
	res.largestName, res.largestObject, res.groupDocuments, err = objectSizes(ctx, k)
	logf("N=%d: every status set %s after the last apply (%s after the replicas' report); operator CPU %s, %s an object; largest object %s (%d bytes)",
		n, res.status.Round(time.Millisecond), res.afterReport.Round(time.Millisecond), res.cpu.Round(time.Millisecond),
		res.cpuPerObject().Round(10*time.Microsecond), res.largestName, res.largestObject)
	return res, err
}

// groupDocs is what a replica reads: the group's Serve config and DNAT mappings.
type groupDocs struct {
	serve  *contract.ServeConfig
	dnat   *contract.DNATConfig
	shards int
}

func (d groupDocs) names() []string {
	names := slices.Collect(maps.Keys(d.serve.Services))
	names = append(names, slices.Collect(maps.Keys(d.dnat.Services))...)
	slices.Sort(names)
	return slices.Compact(names)
}

func readGroupDocs(ctx context.Context, k client.Client) (groupDocs, error) {
	main := benchGroup + "-ingress-config"
	var shards []map[string][]byte
	for i, count := 0, 1; i < count; i++ {
		cm := &corev1.ConfigMap{}
		if err := k.Get(ctx, client.ObjectKey{Namespace: opNS, Name: contract.ShardName(main, i)}, cm); err != nil {
			return groupDocs{}, err
		}
		data := map[string][]byte{}
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		if i == 0 {
			n, err := contract.ShardCount(data)
			if err != nil {
				return groupDocs{}, err
			}
			count = n
		}
		shards = append(shards, data)
	}
	docs := contract.MergeShards(shards)
	d := groupDocs{serve: &contract.ServeConfig{}, dnat: &contract.DNATConfig{}, shards: len(shards)}
	if docs.ServeErr == nil {
		d.serve = docs.Serve
	}
	if docs.DNATErr == nil {
		d.dnat = docs.DNAT
	}
	return d, nil
}

// replicas play a ProxyGroup's two replicas: once a second at most, when the documents
// changed, each reports advertising every service in them, with a certificate for each name,
// through the proxy's own writer (over as many Secrets as the documents).
type replicas struct {
	k8s     client.Client
	secrets corev1client.SecretInterface
	pods    []*corev1.Pod
	stores  []*secretstore.Store

	mu      sync.Mutex
	reports []replicaReport
}

type replicaReport struct {
	at       time.Time
	services int
}

// reportedAll is when the replicas first reported advertising n services.
func (r *replicas) reportedAll(n int) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rp := range r.reports {
		if rp.services >= n {
			return rp.at
		}
	}
	return time.Time{}
}

func (r *replicas) run(ctx context.Context) {
	var last []string
	for ctx.Err() == nil {
		time.Sleep(time.Second)
		d, err := readGroupDocs(ctx, r.k8s)
		if err != nil {
			continue
		}
		names := d.names()
		if slices.Equal(names, last) {
			continue
		}
		again, err := r.report(ctx, d, names)
		if err != nil {
			continue
		}
		if last = names; again {
			last = nil
		}
		r.mu.Lock()
		r.reports = append(r.reports, replicaReport{at: time.Now(), services: len(names)})
		r.mu.Unlock()
	}
}

// report writes the replicas' reports, and says whether to write them again.
func (r *replicas) report(ctx context.Context, d groupDocs, names []string) (again bool, err error) {
	now := time.Now()
	certs := map[string]contract.CertificateStatus{}
	for name := range d.serve.Services {
		fqdn := strings.TrimPrefix(name, "svc:") + ".tailnet.test"
		sum := sha256.Sum256([]byte(fqdn))
		certs[fqdn] = contract.CertificateStatus{Source: contract.CertSourceACME, Serial: hex.EncodeToString(sum[:8]),
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(60 * 24 * time.Hour)}
	}
	for i, pod := range r.pods {
		st := &contract.ProxyState{DeviceID: fmt.Sprintf("n%d", i), FQDN: fmt.Sprintf("%s-%d.tailnet.test", benchGroup, i),
			TailnetIPs: []string{fmt.Sprintf("100.64.0.%d", 10+i)}, ConfigVersion: contract.ProxyConfigs.Newest(), PodUID: string(pod.UID),
			Advertised: names}
		if i == 0 {
			st.Certificates = certs
		}
		data, err := st.Data()
		if err != nil {
			return false, err
		}
		if len(r.stores) <= i {
			store, err := secretstore.New(ctx, r.secrets, pod.Name)
			if err != nil {
				return false, err
			}
			r.stores = append(r.stores, store)
		}
		r.stores[i].SetReportShards(d.shards)
		// Written whole while the operator makes the Secrets of new shards: reported, and
		// to be written again.
		if err := r.stores[i].Report(ctx, data); errors.Is(err, secretstore.ErrWrittenWhole) {
			again = true
		} else if err != nil {
			return false, err
		}
	}
	return again, nil
}

// configured counts the Ingresses with a load-balancer hostname and the Services whose
// TailscaleIngressSvcConfigured condition is true.
func configured(ctx context.Context, k client.Client) (ings, svcs int, err error) {
	il := &networkingv1.IngressList{}
	if err := k.List(ctx, il, client.InNamespace(appsNS)); err != nil {
		return 0, 0, err
	}
	for _, ing := range il.Items {
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) > 0 && lb[0].Hostname != "" {
			ings++
		}
	}
	sl := &corev1.ServiceList{}
	if err := k.List(ctx, sl, client.InNamespace(appsNS)); err != nil {
		return 0, 0, err
	}
	for _, s := range sl.Items {
		if meta.IsStatusConditionTrue(s.Status.Conditions, "TailscaleIngressSvcConfigured") {
			svcs++
		}
	}
	return ings, svcs, nil
}

// objectSizes finds the largest ConfigMap or Secret in the operator's namespace, and the size of
// the group's documents.
func objectSizes(ctx context.Context, k client.Client) (largest string, largestBytes, docs int, err error) {
	cms := &corev1.ConfigMapList{}
	if err := k.List(ctx, cms, client.InNamespace(opNS)); err != nil {
		return "", 0, 0, err
	}
	for _, cm := range cms.Items {
		n := 0
		for _, v := range cm.Data {
			n += len(v)
		}
		if cm.Labels["tailscale.com/parent-resource-type"] == "proxygroup" {
			docs += n
		}
		if n > largestBytes {
			largest, largestBytes = "ConfigMap "+cm.Name, n
		}
	}
	secrets := &corev1.SecretList{}
	if err := k.List(ctx, secrets, client.InNamespace(opNS)); err != nil {
		return "", 0, 0, err
	}
	for _, s := range secrets.Items {
		n := 0
		for _, v := range s.Data {
			n += len(v)
		}
		if n > largestBytes {
			largest, largestBytes = "Secret "+s.Name, n
		}
	}
	return largest, largestBytes, docs, nil
}
