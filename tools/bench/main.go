// Command bench measures the project side by side with the original's data path, and against
// itself as the number of objects grows, and writes the run into docs/performance.md: the page's
// marked section "The latest run" is replaced, the rest of the page (written by hand) is kept,
// and the run it replaces goes to the top of docs/reports/performance-history.md. See `make
// bench` and page.go.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"tailscale.com/envknob"
	"tailscale.com/net/netns"
	"tailscale.com/net/tshttpproxy"
)

// Everything runs on loopback: the tailnet clients upload no logs, and their HTTP clients refuse
// Tailscale's hosts (the bootstrap DNS of the public DERP servers), so nothing leaves the machine.
func stayLocal() {
	envknob.SetNoLogsNoSupport()
	// The control plane the bench starts logs nothing the report needs; without a logger,
	// controller-runtime prints a warning with a stack trace that reads like a crash.
	ctrllog.SetLogger(logr.Discard())
	if err := tshttpproxy.SetProxyFunc(func(u *url.URL) (*url.URL, error) {
		if h := strings.ToLower(u.Hostname()); strings.HasSuffix(h, ".tailscale.com") || strings.HasSuffix(h, ".tailscale.io") {
			return nil, fmt.Errorf("bench: not contacting %s", h)
		}
		return nil, nil
	}); err != nil {
		log.Fatal(err)
	}
}

func sizesFlag(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			log.Fatalf("bad size %q: %v", f, err)
		}
		out = append(out, n)
	}
	return out
}

func main() {
	var (
		parts      = flag.String("parts", "datapath,first200,controlplane,memory", "what to measure")
		samples    = flag.Int("samples", 6, "data path: samples per scenario and path")
		sampleDur  = flag.Duration("sample", 1500*time.Millisecond, "data path: length of a sample")
		operator   = flag.String("operator", "", "control plane and memory: the operator binary; built from ./cmd/operator when empty")
		baseline   = flag.String("baseline", "", "control plane and memory: an operator binary to measure side by side (an earlier build)")
		sizes      = flag.String("n", "100,1000,5000", "control plane: numbers of Ingresses (and as many Services) on one ProxyGroup")
		baseName   = flag.String("baseline-name", "baseline", "control plane and memory: what to call the baseline in the report")
		baseSizes  = flag.String("baseline-n", "100", "control plane: the sizes the baseline is measured at")
		out        = flag.String("out", defaultPage, "the page whose latest run's section this run replaces (a new file: a page of this run alone); empty prints the section")
		history    = flag.String("history", "", "where the run replaced in -out goes, newest first; empty: "+defaultHistory+" for "+defaultPage+", nowhere for another -out")
		pprofAddr  = flag.String("operator-pprof", "", "control plane: have the operator serve its profiles at this address")
		port       = flag.Uint("first200-port", 0, "first 200: the new nodes' WireGuard port (0: random)")
		cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the bench's own process")
		memProfile = flag.String("memprofile", "", "write an allocation profile of the bench's own process at the end")
		paths      = flag.String("paths", "", "data path: only the paths whose names start with these (comma-separated: ours, original, plain, direct), to profile one at a time")
		only       = flag.String("scenarios", "", "data path: only the scenarios whose names contain this")
	)
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	netns.SetEnabled(false)
	stayLocal()
	operatorPprof = *pprofAddr
	firstPort = uint16(*port)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	want := map[string]bool{}
	for _, p := range strings.Split(*parts, ",") {
		want[strings.TrimSpace(p)] = true
	}
	rep := &report{started: time.Now(), loadBefore: loadAverage(), command: "go run ./tools/bench " + strings.Join(os.Args[1:], " "),
		samples: *samples, sampleDur: *sampleDur, scale: map[string][]scaleResult{}}

	if want["datapath"] || want["first200"] {
		d, err := startDataPath(ctx)
		if err != nil {
			log.Fatal(err)
		}
		d.only(*paths, *only)
		rep.targets = d.targets
		if want["datapath"] {
			if rep.dataPath, err = d.measure(ctx, *samples, *sampleDur, log.Printf); err != nil {
				log.Fatal(err)
			}
		}
		if want["first200"] {
			for i := range *samples {
				r, err := d.measureFirst200(ctx, i)
				if err != nil {
					log.Fatal(err)
				}
				log.Printf("first 200: up %s, certificate %s, in the client's netmap %s, first 200 %s: %s", r.up, r.cert, r.peerSeen, r.first200, strings.Join(r.attempts, "; "))
				rep.first200 = append(rep.first200, r)
			}
		}
		d.close()
	}
	if want["controlplane"] || want["memory"] {
		dir, err := os.MkdirTemp("", "bench-bin-")
		if err != nil {
			log.Fatal(err)
		}
		defer logErr("removing "+dir, func() error { return os.RemoveAll(dir) })
		bin := *operator
		if bin == "" {
			if bin, err = buildOperator(dir); err != nil {
				log.Fatal(err)
			}
		}
		bins := map[string]string{"this build": bin}
		if *baseline != "" {
			bins[*baseName] = *baseline
		}
		if want["controlplane"] {
			base := map[int]bool{}
			for _, n := range sizesFlag(*baseSizes) {
				base[n] = true
			}
			for _, n := range sizesFlag(*sizes) {
				for _, name := range sortedKeys(bins) {
					if name == *baseName && !base[n] {
						continue
					}
					res, err := measureScale(ctx, bins[name], n, func(f string, a ...any) { log.Printf(name+": "+f, a...) })
					if err != nil {
						log.Printf("%s, N=%d: %v", name, n, err)
					}
					rep.scale[name] = append(rep.scale[name], res)
				}
			}
		}
		if want["memory"] {
			rep.memory, err = measureMemory(ctx, bins, log.Printf)
			if err != nil {
				log.Fatal(err)
			}
		}
	}
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			log.Fatal(err)
		}
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
	rep.finished, rep.loadAfter = time.Now(), loadAverage()
	if *out == "" {
		if _, err := os.Stdout.Write(rep.markdown()); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *history == "" && filepath.Clean(*out) == defaultPage {
		*history = defaultHistory
	}
	if err := rep.writeRun(*out, *history); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote the run into %s; the run it replaced, if any, into %s", *out, cmp.Or(*history, "nothing (no -history)"))
}
