package controller

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// A proxy that waits for an interactive login says so in its state; the operator shows it on
// the object, a condition where it has one, and a Warning Event.
var _ = Describe("A proxy waiting for a login", func() {
	It("is a Service's condition and a Warning Event", func() {
		ns := newNamespace()
		svc := newService(ns, "login", nil)
		Eventually(proxyReady(svc)).Should(HaveField("Reason", kit.ReasonProxyPending))
		reportState(proxies.ParentTypeService, svc, contract.ProxyState{Login: contract.LoginNeeded})
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyNeedsLogin),
			HaveField("Message", ContainSubstring("waits for an interactive login"))))
		Eventually(func(g Gomega) []string { return eventReasons(g, "Service", svc.Name) }).Should(ContainElement(kit.ReasonProxyNeedsLogin))
	})

	It("is an Ingress's Warning Event", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "login", nil)
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{Login: contract.LoginNeeded})
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(kit.ReasonProxyNeedsLogin))
	})
})
