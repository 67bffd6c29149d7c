package kit

import "github.com/tsingress/tsingress/internal/acmebudget"

// Every reason the operator gives, on an Event or a condition, is declared here and listed in
// docs/reasons.md (reasons_test.go keeps the two equal). Reasons are stable: users alert on them.

// Progress, as Normal Events, each once per step.
const (
	ReasonProxyDeployed           = "ProxyDeployed"           // a standalone proxy's StatefulSet was created
	ReasonDeviceJoined            = "DeviceJoined"            // a proxy (or a group's replica) joined the tailnet
	ReasonCertificateIssued       = "CertificateIssued"       // the CA issued the tailnet name's certificate
	ReasonServing                 = "Serving"                 // traffic to the tailnet name or address reaches the object
	ReasonTailscaleServiceCreated = "TailscaleServiceCreated" // the Tailscale Service of an object on a ProxyGroup was created
	ReasonFunnelEnabled           = "FunnelEnabled"           // an Ingress's tailnet name is served to the internet through Funnel
)

// Ingress routes and annotations. networking.k8s.io/v1 Ingresses have no conditions, so Events
// and status.loadBalancer are what users see.
const (
	ReasonInvalidIngressBackend = "InvalidIngressBackend"
	ReasonInvalidBackendCA      = "InvalidBackendCA"
	ReasonUnsupportedHost       = "UnsupportedIngressHost"
	ReasonUnsupportedPath       = "UnsupportedIngressPath"
	ReasonDuplicatePath         = "DuplicateIngressPath"
	ReasonPathUndefined         = "PathUndefined"       // Normal: a rule without paths
	ReasonHTTPRedirectIgnored   = "HTTPRedirectIgnored" // Normal: http-endpoint takes port 80 from http-redirect
	ReasonEndpointsNotListed    = "EndpointsNotListed"  // Normal: a backend is reached through its ClusterIP only
	ReasonNoValidBackends       = "NoValidBackends"
	ReasonInvalidAnnotation     = "InvalidAnnotation"
	// A tailscale.com/ annotation this operator does not honour on that kind of object (one of
	// the original's it has not got, or a typo): named, so that it is not silently ignored.
	ReasonUnsupportedAnnotation = "UnsupportedAnnotation"
	ReasonInvalidHostname       = "InvalidHostname"
	ReasonHTTPSNotEnabled       = "HTTPSNotEnabled"
	// Funnel asked for and not on; also the error of port 443 in status.loadBalancer.
	ReasonFunnelNotPermitted = "FunnelNotPermitted" // the tailnet's policy does not grant the proxies' tags the funnel attribute
	// the operator's settings keep the object's namespace off Funnel
	ReasonFunnelNamespaceNotPermitted = "FunnelNamespaceNotPermitted"
	ReasonFunnelFailed                = "FunnelFailed" // the proxy could not set Funnel up
)

// Any object with a proxy.
const (
	ReasonProxyClassNotReady = "ProxyClassNotReady"
	// A ProxyClass field that this object's proxy does not have (tailscaleInitContainer on an
	// Ingress's L7 proxy); the rest of the class applies.
	ReasonProxyClassFieldIgnored = "ProxyClassFieldIgnored"
	// A ProxyClass named for an object that does not run with it (a GatewayClass's, for a
	// Gateway on a ProxyGroup, whose replicas run with the group's).
	ReasonProxyClassIgnored = "ProxyClassIgnored"
	ReasonTailnetAPIFailed  = "TailnetAPIFailed" // the message carries the control plane's reason
	ReasonCleanupFailed     = "CleanupFailed"
	// The proxy's state Secret holds what the proxy cannot have written (a hand edit).
	ReasonProxyStateInvalid = "ProxyStateInvalid"
	// The device a proxy's state names is not, by the tailnet API, the one its key was minted
	// for: it is not deleted with the proxy.
	ReasonDeviceNotMinted = "DeviceNotMinted"
	// The proxy waits for an interactive login: the control server refused its auth key, or it
	// has none.
	ReasonProxyNeedsLogin = "ProxyNeedsLogin"
)

// Certificates, on Events and in an Ingress's status.loadBalancer port errors.
const (
	ReasonTLSSecretNotFound         = "TLSSecretNotFound"
	ReasonTLSSecretNotPermitted     = "TLSSecretNotPermitted"
	ReasonTLSSecretWrongType        = "TLSSecretWrongType"
	ReasonTLSSecretInvalid          = "TLSSecretInvalid"
	ReasonCertificateExpired        = "CertificateExpired"
	ReasonCertificateHostMismatch   = "CertificateHostMismatch"
	ReasonCertificateRateLimited    = acmebudget.ReasonDomainLimit
	ReasonDuplicateCertificateLimit = acmebudget.ReasonNameLimit
	ReasonCertificateIssueFailed    = "CertificateIssuanceFailed"
	// A hold in the Serve config only: the proxy has not reported the tailnet's domain yet.
	ReasonWaitingForTailnetDomain = "WaitingForTailnetDomain"
)

// The TailscaleProxyReady condition of a standalone L3 Service (the original operator's names)
// and Service Events.
const (
	ReasonProxyPending   = "ProxyPending" // waiting: for the ProxyClass, the Pod, the tailnet login or the DNAT rules
	ReasonProxyInvalid   = "ProxyInvalid" // the Service or its annotations cannot be served as they are
	ReasonProxyFailed    = "ProxyFailed"  // the control plane or the proxy reported an error
	ReasonProxyReady     = "ProxyCreated" // traffic to the tailnet address reaches the Service
	ReasonInvalidService = "InvalidService"
	// The proxy Pod has IP forwarding off and cannot turn it on: nothing is forwarded.
	ReasonIPForwardingDisabled = "IPForwardingDisabled"
	// One address family of the Service is not forwarded (IPv6 disabled in the proxy Pod, say);
	// the other is.
	ReasonIPFamilyNotForwarded = "IPFamilyNotForwarded"
)

// Objects served by a ProxyGroup, and the TailscaleIngressSvc conditions of such Services (the
// original operator's names).
const (
	ReasonProxyGroupNotFound  = "ProxyGroupNotFound"
	ReasonProxyGroupWrongType = "ProxyGroupWrongType"
	// The namespace's ProxyGroupPolicies do not list the ProxyGroup named.
	ReasonProxyGroupNotPermitted = "ProxyGroupNotPermitted"
	ReasonDuplicateHostname      = "DuplicateHostname"
	ReasonInvalidTailscaleSvc    = "InvalidTailscaleService"
	ReasonUnsupportedIPFamily    = "UnsupportedIPFamily"
	ReasonConfigMapFull          = "ProxyGroupConfigFull"
	ReasonIngressSvcValid        = "IngressSvcValid"
	ReasonIngressSvcConfigured   = "IngressSvcConfigured"
	ReasonIngressSvcNoBackends   = "IngressSvcNoBackendsConfigured"
	ReasonIngressSvcCreateFailed = "IngressSvcCreationFailed"
)

// The ProxyGroupReady and ProxyGroupAvailable conditions, and ProxyGroup Events.
const (
	ReasonProxyGroupReady      = "ProxyGroupReady"
	ReasonProxyGroupAvailable  = "ProxyGroupAvailable"
	ReasonProxyGroupCreating   = "ProxyGroupCreating"
	ReasonProxyGroupInvalid    = "ProxyGroupInvalid"
	ReasonProxyGroupPending    = "ProxyGroupPending"
	ReasonProxyGroupFailed     = "ProxyGroupCreationFailed"
	ReasonProxyGroupNoReplicas = "NoReplicasUp"
)

// The TailnetReady condition and Tailnet Events.
const (
	ReasonTailnetNotServed = "TailnetNotServed"
)

// The ProxyClassReady condition and ProxyClass Events.
const (
	ReasonProxyClassValid   = "ProxyClassValid"
	ReasonProxyClassInvalid = "ProxyClassInvalid"
	ReasonCustomTSEnvVar    = "CustomTSEnvVar"
)

// Conditions of a Service served by a ProxyGroup (the original operator's names).
const (
	ConditionIngressSvcValid      = "TailscaleIngressSvcValid"
	ConditionIngressSvcConfigured = "TailscaleIngressSvcConfigured"
)

// ConditionProxyReady is the condition a standalone L3 proxy reports on its Service.
const ConditionProxyReady = "TailscaleProxyReady"

// The Accepted and SupportedVersion conditions of a GatewayClass (the Gateway API's reasons),
// and its Warning Events. Accepted and InvalidParameters are also a Gateway's, and Accepted a
// listener's and a route's.
const (
	ReasonGatewayClassAccepted = "Accepted"
	ReasonInvalidParameters    = "InvalidParameters"
	ReasonSupportedVersion     = "SupportedVersion"
	ReasonUnsupportedVersion   = "UnsupportedVersion"
)

// The conditions of a Gateway, its listeners and its HTTPRoutes' parents (the Gateway API's
// reasons), and their Warning Events.
const (
	ReasonListenersNotValid          = "ListenersNotValid"
	ReasonGatewayInvalid             = "Invalid" // also a listener's Programmed=False
	ReasonUnsupportedAddress         = "UnsupportedAddress"
	ReasonProgrammed                 = "Programmed"
	ReasonPending                    = "Pending"
	ReasonUnsupportedProtocol        = "UnsupportedProtocol" // also a backend port's appProtocol
	ReasonPortUnavailable            = "PortUnavailable"
	ReasonUnsupportedValue           = "UnsupportedValue"
	ReasonResolvedRefs               = "ResolvedRefs"
	ReasonInvalidRouteKinds          = "InvalidRouteKinds"
	ReasonNoConflicts                = "NoConflicts"
	ReasonProtocolConflict           = "ProtocolConflict"
	ReasonNoMatchingParent           = "NoMatchingParent"
	ReasonNotAllowedByListeners      = "NotAllowedByListeners"
	ReasonNoMatchingListenerHostname = "NoMatchingListenerHostname"
	ReasonRefNotPermitted            = "RefNotPermitted"
	ReasonInvalidCertificateRef      = "InvalidCertificateRef"
	ReasonBackendNotFound            = "BackendNotFound"
	ReasonInvalidKind                = "InvalidKind"
)
