package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

const opNS = "tailscale"

// cluster is a real control plane (kube-apiserver, etcd, kube-controller-manager), a local
// tailnet for the operator's API calls, and the operator running as its own process, so that its
// CPU time and memory are its own.
type cluster struct {
	cp       *testenv.ControlPlane
	lt       *localtailnet.LocalTailnet
	k8s      client.Client
	operator *exec.Cmd
	dir      string
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := tsv1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// buildOperator builds cmd/operator into dir.
func buildOperator(dir string) (string, error) {
	bin := filepath.Join(dir, "operator")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/operator")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return bin, cmd.Run()
}

// operatorPprof, when set, is where the operator serves its profiles during a run.
var operatorPprof string

func startCluster(ctx context.Context, operatorBin string, logFile string) (*cluster, error) {
	c := &cluster{}
	var err error
	if c.dir, err = os.MkdirTemp("", "bench-cluster-"); err != nil {
		return nil, err
	}
	if c.cp, err = testenv.Start(filepath.Join("config", "crd", "bases")); err != nil {
		return nil, fmt.Errorf("control plane (run from the repository root with KUBEBUILDER_ASSETS set): %w", err)
	}
	if c.k8s, err = client.New(c.cp.Config, client.Options{Scheme: newScheme()}); err != nil {
		return nil, err
	}
	if err := c.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNS}}); err != nil {
		return nil, err
	}
	if c.lt, err = localtailnet.Start(context.Background(), localtailnet.Options{HTTPS: true}); err != nil {
		return nil, err
	}
	idFile, secretFile, err := c.lt.WriteOAuthFiles(c.dir)
	if err != nil {
		return nil, err
	}
	out, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	c.operator = exec.Command(operatorBin,
		"--operator-namespace="+opNS, "--control-url="+c.lt.ControlURL,
		"--client-id-file="+idFile, "--client-secret-file="+secretFile,
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--proxy-image=unused",
		// A private CA's limits: Let's Encrypt's 50 a week would hold most names of a large group.
		"--acme-new-certificates-per-week=1000000", "--acme-certificates-per-name-per-week=1000")
	if operatorPprof != "" {
		c.operator.Args = append(c.operator.Args, "--pprof-bind-address="+operatorPprof)
	}
	c.operator.Env = append(os.Environ(), "KUBECONFIG="+c.cp.Kubeconfig)
	c.operator.Stdout, c.operator.Stderr = out, out
	if err := c.operator.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

// close stops everything, logging what fails to.
func (c *cluster) close() {
	var errs []error
	if c.operator != nil && c.operator.Process != nil {
		_ = c.operator.Process.Signal(os.Interrupt) // fails only once it has exited, as Wait says
		var waitErr error
		done := make(chan struct{})
		go func() { waitErr = c.operator.Wait(); close(done) }()
		select {
		case <-done:
			if waitErr != nil {
				errs = append(errs, fmt.Errorf("the operator: %w", waitErr))
			}
		case <-time.After(10 * time.Second):
			_ = c.operator.Process.Kill() // as above
			<-done                        // waitErr is "signal: killed", as meant
			errs = append(errs, errors.New("the operator did not stop within 10s of an interrupt; killed"))
		}
	}
	if c.lt != nil {
		errs = append(errs, c.lt.Close())
	}
	if c.cp != nil {
		errs = append(errs, c.cp.Stop())
	}
	errs = append(errs, os.RemoveAll(c.dir))
	if err := errors.Join(errs...); err != nil {
		log.Printf("closing the cluster: %v", err)
	}
}

// cpuTime is the operator's user and system CPU time so far.
func (c *cluster) cpuTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.operator.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}

// rss is the operator's resident memory now.
func (c *cluster) rss() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.operator.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for the operator")
}

// parallel runs f(i) for i in [0, n) on workers goroutines and returns the first error.
func parallel(n, workers int, f func(i int) error) error {
	next := make(chan int)
	errs := make(chan error, workers)
	for range workers {
		go func() {
			var first error
			for i := range next {
				if err := f(i); err != nil && first == nil {
					first = err
				}
			}
			errs <- first
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
