//go:build e2e

package e2e

import (
	"encoding/pem"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("An https backend", func() {
	It("is verified against the CA a ConfigMap names, for its Service's name, and refused once the ConfigMap holds another CA", func(ctx SpecContext) {
		if suite.localBackend != "" {
			Skip("the local environment runs no workload Pods: the https server is agnhost's, on kind")
		}
		ns := suite.NewNamespace(ctx, "e2e")
		ca, other := newTestCA(), newTestCA()
		now := time.Now()
		// The certificate names the Service as the proxy verifies it by default.
		data, _ := ca.issue("secure."+ns+".svc", now.Add(-time.Hour), now.Add(24*time.Hour))
		suite.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure-tls"}, Type: corev1.SecretTypeTLS, Data: data})
		labels := map[string]string{"app": "secure"}
		suite.Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure"},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						Containers: []corev1.Container{{
							Name: "https", Image: suite.backendImage,
							Args:         []string{"netexec", "--http-port=8443", "--tls-cert-file=/tls/tls.crt", "--tls-private-key-file=/tls/tls.key"},
							VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}},
						}},
						Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "secure-tls"}}}},
					},
				},
			},
		})
		suite.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure"},
			Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "web", Port: 8443, TargetPort: intstr.FromInt32(8443)}}},
		})
		bundle := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure-ca"},
			Data: map[string]string{"ca.crt": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))}}
		suite.Create(ctx, bundle)
		ing := framework.Ingress(ns, "secure", "e2e-secure-"+framework.Token(), "")
		ing.Annotations = map[string]string{"tailscale.com/backend-ca": bundle.Name}
		ing.Spec.DefaultBackend.Service.Name = "secure"
		ing.Spec.DefaultBackend.Service.Port.Name = "web"
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)
		expectHTTPSEcho(ctx, fqdn)

		By("refusing the backend once the ConfigMap holds a CA that did not issue its certificate")
		Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(bundle), bundle)).To(Succeed())
		bundle.Data["ca.crt"] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: other.cert.Raw}))
		Expect(suite.K8s.Update(ctx, bundle)).To(Succeed())
		hc := tailnetHTTPClient(15 * time.Second)
		defer hc.CloseIdleConnections()
		Eventually(ctx, func(g Gomega) int {
			resp, err := hc.Get("https://" + fqdn + "/echo?msg=x")
			g.Expect(err).NotTo(HaveOccurred())
			resp.Body.Close()
			return resp.StatusCode
		}).Should(Equal(http.StatusBadGateway), "GET https://%s once the backend's CA is another", fqdn)
	})
})
