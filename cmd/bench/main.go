// Command bench measures the project against the original's data path and against itself as
// the number of objects grows, and writes docs/performance.md. See `make bench`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/url"
	"strings"
	"os"
	"os/signal"
	"runtime/pprof"
	"time"

	"tailscale.com/envknob"
	"tailscale.com/net/netns"
	"tailscale.com/net/tshttpproxy"
)

// Everything runs on loopback: the tailnet clients upload no logs, and their HTTP clients refuse
// Tailscale's hosts (the bootstrap DNS of the public DERP servers), so nothing leaves the machine.
func stayLocal() {
	envknob.SetNoLogsNoSupport()
	if err := tshttpproxy.SetProxyFunc(func(u *url.URL) (*url.URL, error) {
		if h := strings.ToLower(u.Hostname()); strings.HasSuffix(h, ".tailscale.com") || strings.HasSuffix(h, ".tailscale.io") {
			return nil, fmt.Errorf("bench: not contacting %s", h)
		}
		return nil, nil
	}); err != nil {
		log.Fatal(err)
	}
}

func main() {
	var (
		only       = flag.String("only", "", "run one part: datapath, controlplane or memory")
		samples    = flag.Int("samples", 6, "data path: samples per scenario and target")
		sampleDur  = flag.Duration("sample", 1500*time.Millisecond, "data path: length of a sample")
		cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the whole run")
	)
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	netns.SetEnabled(false)
	stayLocal()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *only == "" || *only == "datapath" {
		d, err := startDataPath(ctx)
		if err != nil {
			log.Fatal(err)
		}
		res, err := d.measure(ctx, *samples, *sampleDur, log.Printf)
		d.close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(len(res))
	}
}
