package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// report is everything one run measured.
type report struct {
	started, finished time.Time
	loadBefore        string
	loadAfter         string
	command           string
	dataPath          []dataPathResult
	first200          []firstResult
	targets           []target
	samples           int
	sampleDur         time.Duration
	scale             map[string][]scaleResult // by operator build
	memory            []memoryResult
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %d GiB of memory", (kb+(1<<19))>>20)
		}
	}
	return fmt.Sprintf("%d cores (%s)%s, %s", runtime.NumCPU(), cpu, mem, runtime.Version())
}

func commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func mib(b int64) string { return fmt.Sprintf("%d MiB", (b+(1<<19))>>20) }

func secs(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// markdown renders the report as the latest run's section of docs/performance.md (page.go):
// the run's machine and command, then a "###" section for each part it measured.
func (r *report) markdown() []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("- Machine: %s.", machine())
	p("- Run: %s, %s to %s; load average %s before, %s after (the machine is shared: other work ran meanwhile).",
		commit(), r.started.UTC().Format("2006-01-02 15:04"), r.finished.UTC().Format("15:04"), r.loadBefore, r.loadAfter)
	p("- Command: `%s`.", r.command)
	p("")
	p("### Against the goals")
	p("")
	p("Issue 18's targets, judged from this run's figures (medians; a goal this run did not measure says so).")
	p("")
	p("| goal | met | figure |")
	p("|---|---|---|")
	for _, g := range r.goals() {
		p("| %s | %s | %s |", g.name, g.met, g.figure)
	}
	if len(r.dataPath) > 0 {
		p("")
		p("### L7 data path")
		p("")
		p("One tsnet client on a local tailnet (control, DERP and ACME CA on loopback) requests the same backend")
		p("through each path; %d samples of %s per scenario and path, the paths interleaved sample by sample", r.samples, r.sampleDur)
		p("(the order reversed every other sample); the table shows medians (the median sample's rate, the")
		p("median of the samples' p99). Every node runs in the bench's process, so every path pays the client's")
		p("share alike.")
		p("")
		p("- **ours**: the proxy's web server (`internal/proxy/web`) on a tsnet node, as a standalone Ingress proxy runs it.")
		p("- **original (Serve)**: tailscale's own Serve on a tsnet node (`LocalClient().SetServeConfig`, HTTPS on 443 proxying to the backend).")
		p("- **plain tsnet**: a tsnet listener with TLS and a bare `httputil.ReverseProxy`: no routing, no identity.")
		p("- **direct loopback**: the backend without a tailnet or TLS: the ceiling.")
		p("- **ours, ProxyGroup**: the proxy's web server on a tagged node hosting a Tailscale Service, taking the service's")
		p("  connections from the node's network stack as a ProxyGroup replica does (`internal/proxy/serviceconn`).")
		p("- **original, ProxyGroup**: Serve on a tagged node hosting a Tailscale Service (`Services` in the Serve config,")
		p("  HTTPS on 443 proxying to the backend), as the original's ProxyGroup replicas serve an Ingress.")
		p("")
		head := "| scenario |"
		sep := "|---|"
		for _, t := range r.targets {
			head += " " + t.name + " |"
			sep += "---|"
		}
		p("%s ours ÷ original | ProxyGroup: ours ÷ original |", head)
		p("%s---|---|", sep)
		for _, res := range r.dataPath {
			row := "| " + res.sc.name + " |"
			for _, t := range r.targets {
				row += " " + res.value(t.name) + " |"
			}
			p("%s **%.2f×** | **%.2f×** |", row, res.ratio(), res.ratioHA())
		}
	}
	if len(r.first200) > 0 {
		var up, cert, seen, first []time.Duration
		for _, f := range r.first200 {
			up, cert, seen, first = append(up, f.up), append(cert, f.cert), append(seen, f.peerSeen), append(first, f.first200)
		}
		p("")
		p("### A new proxy's first HTTPS 200")
		p("")
		p("A new node starts and serves the backend through the proxy's web server, as a standalone Ingress proxy")
		p("does once its config is read; the client, already on the tailnet, tries every 250 ms (each try bounded")
		p("to 2 s) from the moment the node starts. Medians of %d, from the node's start:", len(r.first200))
		p("")
		p("| node up | certificate | node in the client's netmap | first 200 |")
		p("|---|---|---|---|")
		p("| %s | %s | %s | %s |", ms(medianDur(up)), ms(medianDur(cert)), ms(medianDur(seen)), ms(medianDur(first)))
		p("")
		p("The client's tries in the run with the median first 200 (start, outcome, duration):")
		p("")
		mid := medianDur(first)
		for _, f := range r.first200 {
			if f.first200 == mid {
				p("    %s", strings.Join(f.attempts, "\n    "))
				break
			}
		}
	}
	if len(r.scale) > 0 {
		p("")
		p("### Control plane: many objects on one ProxyGroup")
		p("")
		p("The operator runs as its own process against a real API server (envtest's kube-apiserver and etcd, with")
		p("kube-controller-manager) and the local tailnet's API. One ProxyGroup of 2 replicas; N Ingresses and N")
		p("Services (so 2N objects) created 8 at a time. The replicas are played by the bench: once a second at")
		p("most, when the group's documents changed, each reports advertising every service in them, with a")
		p("certificate for each name, as a replica's state Secret says. The certificate limits are raised")
		p("(`--acme-new-certificates-per-week`), as for a private CA: Let's Encrypt's 50 a week would hold most")
		p("names of a large group.")
		p("")
		p("| build | N | apply (2N creates) | last apply → all in the documents | last apply → every status | replicas' report → every status | operator CPU per object | largest object |")
		p("|---|---|---|---|---|---|---|---|")
		for _, name := range sortedKeys(r.scale) {
			for _, s := range r.scale[name] {
				if s.status == 0 {
					p("| %s | %d | %s | not within the bench's limit of %s: %s | | | | |", name, s.n, secs(s.applyTook), secs(s.limit), s.failure)
					continue
				}
				p("| %s | %d | %s | %s | %s | %s | %.1f ms | %s, %d KiB |", name, s.n, secs(s.applyTook), secs(s.docs), secs(s.status),
					secs(s.afterReport), float64(s.cpuPerObject().Microseconds())/1000, s.largestName, s.largestObject>>10)
			}
		}
		p("")
		p("How cost grows with N: the operator CPU per object above, over N. Flat means linear total cost.")
	}
	if len(r.memory) > 0 {
		p("")
		p("### Operator memory")
		p("")
		p("Resident memory (VmRSS, the median of 5 samples 20 s after the objects were created) of each build,")
		p("side by side against one API server, as unrelated objects are added: none is served, so the")
		p("operator only caches what it watches.")
		p("")
		p("| build | empty | + 10,000 Secrets, 4,000 Services, 2,000 ConfigMaps | + 2,000 kubernetes.io/tls Secrets |")
		p("|---|---|---|---|")
		for _, m := range r.memory {
			p("| %s | %s | %s | %s |", m.name, mib(m.empty), mib(m.unrelated), mib(m.withTLS))
		}
	}
	return b.Bytes()
}

func sortedKeys[V any](m map[string]V) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	// "this build" first, then the others by name.
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] == "this build" || (keys[i] != "this build" && keys[j] < keys[i]) {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}
