package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary plays devenv, and the parent that starts it, chosen by roleEnv.
const roleEnv = "DEVENV_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "devenv":
		os.Args = append([]string{"devenv"}, os.Args[1:]...)
		main()
	case "parent": // a shell, say: starts devenv and waits
		child := exec.Command(os.Args[0], os.Args[1:]...)
		child.Env = append(os.Environ(), roleEnv+"=devenv")
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Run(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Every way a `make dev` ends stops every process it started and removes every file and
// network namespace it made.
func TestEveryEndLeavesNothing(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS must point at kube-apiserver, etcd and kube-controller-manager: run the tests with `make test`")
	}
	for _, end := range []struct {
		name string
		// end ends the run: the devenv process, or its parent in case "parent killed"; stdout is
		// the read end of its output's pipe.
		end func(t *testing.T, run *exec.Cmd, stdout io.Closer)
		// clean: devenv shuts down itself, network namespaces too, and exits with status 0.
		clean bool
		// says is what devenv writes on stderr as it stops.
		says string
	}{
		{"Ctrl-C", func(t *testing.T, run *exec.Cmd, _ io.Closer) { signalGroup(t, run, syscall.SIGINT) }, true, "devenv: stopping (got interrupt)"},
		{"Ctrl-C on make dev | tee log", func(t *testing.T, run *exec.Cmd, stdout io.Closer) {
			stdout.Close() // tee got the interrupt too
			signalGroup(t, run, syscall.SIGINT)
		}, true, "devenv: stopping"},
		{"SIGTERM", func(t *testing.T, run *exec.Cmd, _ io.Closer) {
			if err := run.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}, true, "devenv: stopping (got terminated)"},
		{"SIGHUP (terminal closed)", func(t *testing.T, run *exec.Cmd, _ io.Closer) { signalGroup(t, run, syscall.SIGHUP) }, true, "devenv: stopping (got hangup)"},
		{"closed pipe", func(t *testing.T, _ *exec.Cmd, stdout io.Closer) { stdout.Close() }, true, "devenv: stopping (the pipe of its output closed)"},
		{"parent killed", func(t *testing.T, run *exec.Cmd, _ io.Closer) { run.Process.Kill() }, true, "devenv: stopping (got terminated)"},
		// What devenv cannot do, its lifeline does; network namespaces go at the next start.
		{"SIGKILL", func(t *testing.T, run *exec.Cmd, _ io.Closer) { run.Process.Kill() }, false, ""},
	} {
		t.Run(end.name, func(t *testing.T) {
			t.Parallel()
			tmp := filepath.Join(t.TempDir(), "tmp")
			if err := os.Mkdir(tmp, 0o700); err != nil {
				t.Fatal(err)
			}
			role := "devenv"
			if end.name == "parent killed" {
				role = "parent"
			}
			run := exec.Command(os.Args[0], "-logs", filepath.Join(t.TempDir(), "logs"))
			run.Dir = filepath.Join("..", "..") // the repository root, as make runs it
			run.Env = append(os.Environ(), "TMPDIR="+tmp, roleEnv+"="+role)
			run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own, as in a shell
			var stderr syncBuffer
			run.Stderr = &stderr
			stdout, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			run.Stdout = w
			err = run.Start()
			w.Close()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
				_ = run.Wait()
				stdout.Close()
			})
			rest := waitRunning(t, stdout, &stderr)

			devenvPID := run.Process.Pid
			if role == "parent" {
				devenvPID = childOf(t, run.Process.Pid)
			}
			if running := naming(tmp); len(running) < 5 {
				t.Fatalf("processes naming %s while running: %v; want devenv, etcd, kube-apiserver, kube-controller-manager and watchdogs", tmp, running)
			}
			if !end.clean {
				// Its network namespaces, as the next run would.
				t.Cleanup(func() { _, _ = removeStaleNetns() })
			}
			end.end(t, run, stdout)
			exited := make(chan error, 1)
			go func() { exited <- run.Wait() }()
			select {
			case err := <-exited:
				if end.clean && role == "devenv" && err != nil {
					t.Errorf("devenv exited with %v; stderr:\n%s", err, stderr.String())
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("still running 2 minutes after the end; stderr:\n%s", stderr.String())
			}
			// Once devenv is gone (an orphan when its parent was killed), so is everything else.
			deadline := time.Now().Add(2 * time.Minute)
			for {
				left := naming(tmp)
				entries, _ := os.ReadDir(tmp)
				if len(left) == 0 && len(entries) == 0 {
					break
				}
				if time.Now().After(deadline) {
					var names []string
					for _, e := range entries {
						names = append(names, e.Name())
					}
					t.Fatalf("2 minutes after the end: processes %v, files in TMPDIR %v; stderr:\n%s", left, names, stderr.String())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !strings.Contains(stderr.String(), end.says) {
				t.Errorf("stderr does not say %q:\n%s", end.says, stderr.String())
			}
			if ns := ownNetnsOf(devenvPID); end.clean && len(ns) > 0 {
				t.Errorf("network namespaces left: %v", ns)
			}
			if end.clean && !strings.Contains(end.name, "pipe") && !strings.Contains(end.name, "tee") {
				if out := rest(); !strings.Contains(out, "Shutting down:") {
					t.Errorf("no shutdown shown:\n%s", out)
				}
			}
		})
	}
}

// waitRunning reads devenv's output until it says it runs, then keeps reading; rest returns
// what came after, once the output has ended.
func waitRunning(t *testing.T, stdout io.Reader, stderr *syncBuffer) (rest func() string) {
	t.Helper()
	running := make(chan error, 1)
	ended := make(chan struct{})
	var seen, after strings.Builder
	go func() {
		defer close(ended)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			seen.WriteString(line)
			if err != nil {
				running <- err
				return
			}
			if strings.HasPrefix(line, "Running; Ctrl-C stops everything.") {
				running <- nil
				_, _ = io.Copy(&after, r) // a read error ends the output as EOF does
				return
			}
		}
	}()
	select {
	case err := <-running:
		if err != nil {
			t.Fatalf("devenv did not start: %v\n%s\nstderr:\n%s", err, seen.String(), stderr.String())
		}
	case <-time.After(4 * time.Minute):
		t.Fatalf("devenv did not start in 4 minutes; stderr:\n%s", stderr.String())
	}
	return func() string {
		select {
		case <-ended:
			return after.String()
		case <-time.After(time.Minute):
			return "(output still open a minute after the end)"
		}
	}
}

func signalGroup(t *testing.T, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
		t.Fatal(err)
	}
}

// childOf is the PID of the one child of process pid.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, _ := os.ReadFile(f)
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			return child
		}
	}
	t.Fatalf("process %d has no child", pid)
	return 0
}

// naming lists the live processes that name dir in their command line or environment.
func naming(dir string) []string {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var found []string
	for _, p := range procs {
		stat, _ := os.ReadFile(filepath.Join(p, "stat"))
		if bytes.Contains(stat, []byte(") Z ")) || len(stat) == 0 {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		environ, _ := os.ReadFile(filepath.Join(p, "environ"))
		if bytes.Contains(cmdline, []byte(dir)) || bytes.Contains(environ, []byte(dir)) {
			found = append(found, fmt.Sprintf("%s %s", filepath.Base(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
	}
	return found
}

// ownNetnsOf lists the network namespaces of the devenv run with that PID that still exist.
func ownNetnsOf(pid int) []string {
	var names []string
	for name, owner := range devenvNetns() {
		if owner == pid {
			names = append(names, name)
		}
	}
	return names
}

// syncBuffer is a bytes.Buffer that a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
