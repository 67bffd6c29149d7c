// Package contract is the versioned interface between the operator and its proxies: the proxy
// config document the operator writes into a proxy's config Secret, the keys the proxy writes
// back into its state Secret, and the documents of a ProxyGroup's ConfigMap (L7 Serve config
// and L3 DNAT mappings). Both binaries import it, so the two sides cannot drift apart.
//
// Every document is stored under a key that names its schema version, for example
// "proxy-config.v1.json". The writer stores every version it still supports; a reader takes the
// newest version it understands and fails with ErrNoSupportedVersion when there is none. Within
// one version, changes are additive only: readers ignore fields they do not know. A change that
// an older reader would misread gets a new version. docs/contract.md describes the rules.
package contract
