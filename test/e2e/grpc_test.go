//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"net"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("A gRPC backend", func() {
	It("is reached over h2c through an Ingress when its Service port says kubernetes.io/h2c", func(ctx SpecContext) {
		if suite.localBackend != "" {
			Skip("the local environment runs no workload Pods: the gRPC server is agnhost's, on kind")
		}
		ns := suite.NewNamespace(ctx, "e2e")
		// agnhost's gRPC health server listens without TLS, as gRPC servers in a cluster do.
		suite.RunWorkload(ctx, ns, "grpc", suite.backendImage, "grpc-health-checking", "--port=5000", "--http-port=8080")
		suite.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grpc"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "grpc"}, Ports: []corev1.ServicePort{{
				Name: "grpc", Port: 5000, TargetPort: intstr.FromInt32(5000), AppProtocol: ptr.To("kubernetes.io/h2c"),
			}}},
		})
		ing := framework.Ingress(ns, "grpc", "e2e-grpc-"+framework.Token(), "")
		ing.Spec.DefaultBackend.Service.Name = "grpc"
		ing.Spec.DefaultBackend.Service.Port.Name = "grpc"
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)

		conn, err := grpc.NewClient("passthrough:///"+net.JoinHostPort(fqdn, "443"),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return suite.Dial(ctx, "tcp", addr) }),
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: suite.roots, ServerName: fqdn})))
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close()
		health := healthpb.NewHealthClient(conn)
		// agnhost's server implements Check alone (Watch answers Unimplemented): streams through
		// the proxy are proven in internal/proxy/web (TestGRPCStreamingToAnH2CBackend).
		Eventually(ctx, func(g Gomega) {
			res, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res.GetStatus()).To(Equal(healthpb.HealthCheckResponse_SERVING))
		}).Should(Succeed(), "a gRPC call through the Ingress")
	})
})
