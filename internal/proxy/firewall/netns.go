package firewall

import (
	"os"
)

// openNetNS opens the namespace file at path for nftables.WithNetNSFd; "" means the current
// namespace, which the library spells as fd 0.
func openNetNS(path string) (fd int, closeFn func(), err error) {
	if path == "" {
		return 0, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	return int(f.Fd()), func() { _ = f.Close() }, nil
}
