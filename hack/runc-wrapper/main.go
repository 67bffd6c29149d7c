// Command runc-wrapper is an OCI runtime that drops capabilities the machine cannot grant, then runs
// the real runc. Some VMs lack CAP_SYS_RESOURCE in their bounding set, so `docker run --privileged`
// (which kind's nodes are) fails with "unable to apply caps: operation not permitted" because
// Docker asks for every capability it knows. hack/docker-up.sh installs this wrapper as Docker's
// default runtime only on such machines.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// realRunc is the runtime this wrapper hands over to.
const realRunc = "/usr/sbin/runc"

func main() {
	missing, err := missingCapabilities("/proc/self/status")
	if err == nil && len(missing) > 0 {
		if err := rewriteSpecs(os.Args[1:], missing); err != nil {
			fmt.Fprintln(os.Stderr, "runc-wrapper:", err)
			os.Exit(1)
		}
	}
	args := append([]string{realRunc}, os.Args[1:]...)
	err = syscall.Exec(realRunc, args, os.Environ())
	fmt.Fprintln(os.Stderr, "runc-wrapper: exec runc:", err)
	os.Exit(1)
}

// capabilityNames are the kernel's capabilities by bit number.
var capabilityNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
	"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
	"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// missingCapabilities lists the known capabilities absent from the bounding set in a
// /proc/<pid>/status file.
func missingCapabilities(statusFile string) (map[string]bool, error) {
	data, err := os.ReadFile(statusFile)
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		hex, ok := strings.CutPrefix(line, "CapBnd:")
		if !ok {
			continue
		}
		bounding, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("parse CapBnd: %w", err)
		}
		return missingFrom(bounding), nil
	}
	return nil, fmt.Errorf("no CapBnd in %s", statusFile)
}

func missingFrom(bounding uint64) map[string]bool {
	missing := map[string]bool{}
	for bit, name := range capabilityNames {
		if bounding&(1<<bit) == 0 {
			missing[name] = true
		}
	}
	return missing
}

// rewriteSpecs removes the missing capabilities from the bundle's config.json on create and run,
// and from the process file on exec; other commands pass through untouched.
func rewriteSpecs(args []string, missing map[string]bool) error {
	command, flags := splitCommand(args)
	switch command {
	case "create", "run":
		bundle := flagValue(flags, "--bundle", "-b")
		if bundle == "" {
			bundle = "."
		}
		return rewriteFile(filepath.Join(bundle, "config.json"), missing, true)
	case "exec":
		if process := flagValue(flags, "--process", "-p"); process != "" {
			return rewriteFile(process, missing, false)
		}
	}
	return nil
}

// globalFlagsWithValue are runc's global flags that take a separate value.
var globalFlagsWithValue = map[string]bool{"--log": true, "--log-format": true, "--root": true, "--criu": true, "--rootless": true}

// splitCommand finds runc's subcommand after its global flags.
func splitCommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "-") {
			return arg, args[i+1:]
		}
		if globalFlagsWithValue[arg] {
			i++
		}
	}
	return "", nil
}

func flagValue(flags []string, names ...string) string {
	for i, f := range flags {
		for _, name := range names {
			if f == name && i+1 < len(flags) {
				return flags[i+1]
			}
			if v, ok := strings.CutPrefix(f, name+"="); ok {
				return v
			}
		}
	}
	return ""
}

func rewriteFile(path string, missing map[string]bool, isBundleConfig bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := dropCapabilities(data, missing, isBundleConfig)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o600)
}

// dropCapabilities removes the missing capabilities from every set of an OCI spec's process (a
// bundle config) or of a process spec (runc exec --process), keeping every other field as it was.
func dropCapabilities(data []byte, missing map[string]bool, isBundleConfig bool) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	process := doc
	if isBundleConfig {
		raw, ok := doc["process"]
		if !ok {
			return data, nil
		}
		if err := json.Unmarshal(raw, &process); err != nil {
			return nil, err
		}
	}
	raw, ok := process["capabilities"]
	if !ok || string(raw) == "null" {
		return data, nil
	}
	var sets map[string][]string
	if err := json.Unmarshal(raw, &sets); err != nil {
		return nil, err
	}
	for name, caps := range sets {
		kept := caps[:0]
		for _, c := range caps {
			if !missing[c] {
				kept = append(kept, c)
			}
		}
		sets[name] = kept
	}
	var err error
	if process["capabilities"], err = json.Marshal(sets); err != nil {
		return nil, err
	}
	if isBundleConfig {
		if doc["process"], err = json.Marshal(process); err != nil {
			return nil, err
		}
	}
	return json.Marshal(doc)
}
