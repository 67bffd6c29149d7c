package v1alpha1

// Condition types set by the operator. The names match the original operator's, so dashboards
// and `kubectl wait --for=condition=...` scripts keep working.
const (
	// ProxyClassReady is True when a ProxyClass is valid and may be used by proxies.
	ProxyClassReady = "ProxyClassReady"
	// ProxyGroupReady is True when every replica of a ProxyGroup is up on the tailnet.
	ProxyGroupReady = "ProxyGroupReady"
	// ProxyGroupAvailable is True when at least one replica of a ProxyGroup is up on the tailnet.
	ProxyGroupAvailable = "ProxyGroupAvailable"
	// TailnetReady is True when a Tailnet's ProxyGroups may join it; this operator serves its
	// own tailnet only, so it is False.
	TailnetReady = "TailnetReady"
)
