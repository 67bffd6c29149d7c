//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"net"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("A gRPC backend", func() {
	It("is reached over h2c through an Ingress when its Service port says kubernetes.io/h2c", func(ctx SpecContext) {
		ns := newGRPCServer(ctx, ptr.To("kubernetes.io/h2c"))
		ing := framework.Ingress(ns, "grpc", "e2e-grpc-"+framework.Token(), "")
		ing.Spec.DefaultBackend.Service.Name = "grpc"
		ing.Spec.DefaultBackend.Service.Port.Name = "grpc"
		suite.Create(ctx, ing)
		// agnhost's server implements Check alone (Watch answers Unimplemented): streams through
		// the proxy are proven in internal/proxy/web (TestGRPCStreamingToAnH2CBackend).
		expectHealthCheck(ctx, suite.ServedName(ctx, ing), "a gRPC call through the Ingress")
	})

	It("is reached through a GRPCRoute on a Gateway, which routes by service and method", func(ctx SpecContext) {
		// No appProtocol: a GRPCRoute's backend is reached over h2c.
		ns := newGRPCServer(ctx, nil)
		edge := kubeobj.Gateway(ns, "edge", gatewayClass(ctx), kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443))
		edge.Annotations = map[string]string{kit.AnnotationHostname: "e2e-grpcgw-" + framework.Token()}
		suite.Create(ctx, edge)
		suite.Create(ctx, kubeobj.GRPCRoute(ns, "health", edge.Name, "grpc.health.v1.Health", "Check", "grpc", 5000))
		health := expectHealthCheck(ctx, programmedAddresses(ctx, edge, 1)[0].Value, "a gRPC call through the GRPCRoute")

		By("answering a method the route does not match at the proxy, never at the backend")
		// The proxy answers 404 for a path no route matches, which gRPC reads as Unimplemented;
		// the header only the proxy's answer lacks tells it from the backend's Unimplemented.
		var header metadata.MD
		stream, err := health.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		if err == nil {
			_, err = stream.Recv()
		}
		Expect(status.Code(err)).To(Equal(codes.Unimplemented), "Watch through a route for Check alone: %v", err)
		Expect(header.Get("content-type")).NotTo(ContainElement(HavePrefix("application/grpc")), "the backend answered Watch: %v", header)
	})
})

// newGRPCServer makes a namespace with agnhost's gRPC health server behind Service grpc, port
// 5000 of appProtocol appProtocol, on kind (the local environment runs no workload Pods).
func newGRPCServer(ctx context.Context, appProtocol *string) string {
	GinkgoHelper()
	if suite.localBackend != "" {
		Skip("the local environment runs no workload Pods: the gRPC server is agnhost's, on kind")
	}
	ns := suite.NewNamespace(ctx, "e2e")
	// agnhost's gRPC health server listens without TLS, as gRPC servers in a cluster do.
	suite.RunWorkload(ctx, ns, "grpc", suite.backendImage, "grpc-health-checking", "--port=5000", "--http-port=8080")
	suite.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grpc"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "grpc"}, Ports: []corev1.ServicePort{{
			Name: "grpc", Port: 5000, TargetPort: intstr.FromInt32(5000), AppProtocol: appProtocol,
		}}},
	})
	return ns
}

// expectHealthCheck dials fqdn over the tailnet with TLS, waits for a gRPC health check through
// it to answer SERVING, and returns the client (its connection closed with the spec).
func expectHealthCheck(ctx context.Context, fqdn, what string) healthpb.HealthClient {
	GinkgoHelper()
	conn, err := grpc.NewClient("passthrough:///"+net.JoinHostPort(fqdn, "443"),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return suite.Dial(ctx, "tcp", addr) }),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: suite.roots, ServerName: fqdn})))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(conn.Close)
	health := healthpb.NewHealthClient(conn)
	Eventually(ctx, func(g Gomega) {
		res, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.GetStatus()).To(Equal(healthpb.HealthCheckResponse_SERVING))
	}).Should(Succeed(), what)
	return health
}
