package proxy

import "os"

// acmeDirectoryEnv is where tailscaled's certificate flow reads its ACME directory, at every
// issuance; empty means Let's Encrypt.
const acmeDirectoryEnv = "TS_DEBUG_ACME_DIRECTORY_URL"

// useACMEDirectory points this process's certificate flow at url (a ProxyClass's Let's Encrypt
// staging switch, or a private CA). An empty url keeps the process's own setting. A proxy is one
// process, so the process-wide variable is its own.
func useACMEDirectory(url string) error {
	if url == "" {
		return nil
	}
	return os.Setenv(acmeDirectoryEnv, url)
}
