// Package tailnet is the operator's view of the tailnet's control plane: it mints auth keys for
// proxies, finds and deletes devices, manages Tailscale Services (VIP services) and reports
// whether HTTPS certificates can be had.
//
// Controllers depend on the [Client] interface. [APIClient] implements it with the Tailscale
// API v2, authenticated as an OAuth client whose ID and secret are read from files; the base
// URL is configurable, so the same code talks to Tailscale, to a self-hosted control plane
// that serves the API, or to the local tailnet in internal/testing/localtailnet.
//
// # Auth keys
//
// Every key minted here is single-use and pre-authorized, and carries the tags it was asked
// for. A standalone proxy gets one key. A ProxyGroup gets one key per replica, minted when
// that replica's config is first written, rather than one reusable key shared by the group:
// a single-use key is spent by the replica's first login, so a key that leaks from a Secret
// afterwards is worthless, and each replica's device can be traced to its own key. Adding a
// replica mints one more key; nothing already issued has to change.
//
// # Errors
//
// Every failed call returns an *[Error] whose Reason is one of the Reason constants. Reasons
// are stable strings meant for status conditions; [ReasonOf] extracts one from any error and
// [RetryAfter] tells how long the API asked the caller to wait. Errors, logs and the String
// form of [Secret] never contain credentials or auth keys.
//
// # OAuth scopes
//
// The OAuth client needs auth_keys (write), devices:core (read and write), services (read
// and write) and, for [Client.TailnetInfo], feature_settings:read and dns:read. It must own
// the tags it mints keys for.
package tailnet
