// Command proxy joins the tailnet and serves what its config says: HTTPS reverse proxying for
// an Ingress, kernel DNAT for a Service, or both for a ProxyGroup replica.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/version"
)

const defaultConfigDir = "/etc/tsingress/config"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configDir := fs.String("config-dir", envOr("TS_PROXY_CONFIG_DIR", defaultConfigDir), "Directory holding the proxy config (the mounted config Secret).")
	checkOnly := fs.Bool("check-config", false, "Validate the config, print a summary and exit.")
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.Version)
		return 0
	}
	cfg, v, err := contract.ProxyConfigs.DecodeDir(*configDir)
	if err != nil {
		fmt.Fprintf(stderr, "proxy: cannot load config from %s: %v\n", *configDir, err)
		if errors.Is(err, contract.ErrNoSupportedVersion) {
			fmt.Fprintln(stderr, "proxy: the operator writes config versions this proxy image does not read; use a proxy image that matches the operator")
		}
		return 1
	}
	if *checkOnly {
		fmt.Fprintf(stdout, "config v%d ok: %s\n", v, cfg)
		return 0
	}
	fmt.Fprintln(stderr, "proxy: serving is not available in this build yet; use --check-config")
	return 1
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
