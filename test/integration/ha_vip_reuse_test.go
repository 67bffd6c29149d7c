package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

// An HA Ingress on a ProxyGroup of two replicas (each with its kernel data path in a network
// namespace of its own), deleted; then an HA Service on the same group, whose Tailscale Service
// the tailnet gives the VIPs the Ingress's had: once the Ingress's Tailscale Service is released
// the tailnet routes its VIPs nowhere, and once the Service is configured on both replicas the
// client reaches the Service's backend at them, over IPv4 and IPv6, with nothing of the L7
// service in the way.
func TestHAServiceOnVIPsOfDeletedIngress(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	w := startWorldWith(t, localtailnet.Options{HTTPS: true}, contract.FirewallAuto)
	const ns, pg, host, webSvc, dbSvc = "shop", "pg", "ha-web", "svc:ha-web", "svc:shop-db"
	ing := newHAIngressWorld(t, w, ns, pg, host)

	ca := proxytest.NewCA(t)
	var replicas []*haReplica
	var tops []netnstest.Topology
	for i := range 2 {
		top := proxytest.NewTopology(t)
		tops = append(tops, top)
		replicas = append(replicas, newHAReplica(t, w, pg, i, ca, top.Proxy.Path))
	}
	for _, r := range replicas {
		r.start()
	}
	for _, r := range replicas {
		poll.Eventually(t, 60*time.Second, r.name+" advertising "+webSvc, func() error { return r.advertises(w, webSvc) })
	}
	ts, err := w.api.Service(w.ctx, webSvc)
	if err != nil {
		t.Fatal(err)
	}
	webVIPs := ts.Addrs
	laptop := joinClient(t, w, "laptop")
	httpc := haHTTPClient(laptop, ca.Pool())
	poll.Eventually(t, 30*time.Second, "HTTPS to the Ingress", func() error {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		defer cancel()
		return haGet(ctx, httpc, "https://"+host+"."+w.lt.Domain+"/", "web /")
	})

	if err := w.k8s.Delete(w.ctx, ing); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, webSvc+" released", func() error {
		if _, err := w.api.Service(w.ctx, webSvc); !tailnet.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	for _, vip := range webVIPs {
		dst := netip.AddrPortFrom(vip, 443).String()
		poll.Eventually(t, 10*time.Second, "no route to "+dst, func() error {
			ctx, cancel := context.WithTimeout(w.ctx, 3*time.Second)
			defer cancel()
			c, err := tailnetdial.Dial(ctx, laptop, "tcp", dst)
			if err == nil {
				c.Close()
				return errors.New("still routed to a replica")
			}
			if !errors.Is(err, tailnetdial.ErrNoRoute) {
				return err
			}
			return nil
		})
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db", Annotations: map[string]string{kit.AnnotationProxyGroup: pg}},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: ptr.To(kit.LoadBalancerClass),
			IPFamilyPolicy:    ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			Ports:             []corev1.ServicePort{{Name: "pg", Port: proxytest.EchoTCPPort, Protocol: corev1.ProtocolTCP}},
		},
	}
	if err := w.k8s.Create(w.ctx, svc); err != nil {
		t.Fatal(err)
	}
	for i, top := range tops {
		for _, ip := range svc.Spec.ClusterIPs {
			proxytest.AddBackend(t, top, netip.MustParseAddr(ip), replicas[i].name)
		}
	}
	var dbVIPs []netip.Addr
	poll.Eventually(t, 90*time.Second, "Service configured on both replicas", func() error {
		ts, err := w.api.Service(w.ctx, dbSvc)
		if err != nil {
			return err
		}
		dbVIPs = ts.Addrs
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcConfigured)
		if c == nil || c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, "2/2 ") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	// What this test is about: the tailnet gave the Service the VIPs the Ingress had.
	if !slices.Equal(dbVIPs, webVIPs) {
		t.Fatalf("%s has VIPs %v, not those %s had (%v): the tailnet did not reuse them", dbSvc, dbVIPs, webSvc, webVIPs)
	}
	for _, vip := range dbVIPs {
		dst := netip.AddrPortFrom(vip, proxytest.EchoTCPPort).String()
		poll.Eventually(t, 30*time.Second, "TCP to "+dst, func() error {
			ctx, cancel := context.WithTimeout(w.ctx, 3*time.Second)
			defer cancel()
			_, err := proxytest.Echo(ctx, laptop, "tcp", dst)
			return err
		})
	}
}
