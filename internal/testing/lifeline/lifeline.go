// Package lifeline cleans up after a process however it ends, including the ends it cannot
// handle itself: SIGKILL, a crash, a test binary killed at its timeout. A watchdog process
// (the same executable, started again) holds the read end of a pipe whose write end only the
// owner has; when that end closes, the owner is gone, and the watchdog kills every process that
// names the owner's directory in its command line or environment (kube-apiserver's --cert-dir,
// etcd's --data-dir, children given TMPDIR=dir), then removes the directory.
//
// A binary that uses the package must let its init run before anything else matters: the
// watchdog is that binary started with one variable set, and does its work from init.
package lifeline

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// watchdogEnv names the directory a watchdog cleans; only watchdogs have it.
const watchdogEnv = "TSINGRESS_LIFELINE_DIR"

func init() {
	if dir := os.Getenv(watchdogEnv); dir != "" {
		watch(dir, os.Stdin, os.Getppid())
		os.Exit(0)
	}
}

// Lifeline is a running watchdog for one directory.
type Lifeline struct {
	pipe *os.File
	cmd  *exec.Cmd
}

// Start starts a watchdog for dir, an absolute path that the caller made and that only what it
// starts names.
func Start(dir string) (*Lifeline, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("lifeline: %q is not an absolute path", dir)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("lifeline: %w", err)
	}
	r, w, err := os.Pipe() // close-on-exec: no other child inherits the write end
	if err != nil {
		return nil, fmt.Errorf("lifeline: %w", err)
	}
	defer r.Close() //nolint:errcheck // the child has its own copy; ours is only let go
	cmd := exec.Command(exe)
	cmd.Args[0] = "tsingress-lifeline"
	cmd.Env = append(os.Environ(), watchdogEnv+"="+filepath.Clean(dir))
	// No stdout or stderr: a pipe held open would keep a reader (go test, a terminal pipeline)
	// waiting for the watchdog. A process group of its own keeps terminal signals away.
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("lifeline: starting the watchdog: %w", err)
	}
	return &Lifeline{pipe: w, cmd: cmd}, nil
}

// Close lets the watchdog clean up what is left, as if the owner had exited, and waits until
// it has.
func (l *Lifeline) Close() error {
	err := l.pipe.Close()
	return errors.Join(err, l.cmd.Wait())
}

// watch waits for the owner, process ownerPID, to close its end of the pipe, then cleans up.
func watch(dir string, pipe io.Reader, ownerPID int) {
	// Only the owner's end decides; the signals that end a session or a pipeline do not.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	_, _ = io.Copy(io.Discard, pipe)
	cleanup(dir, ownerPID)
}

// cleanup kills the processes that name dir, other than the owner (alive when it closed the
// pipe itself), waits for them to go, and removes dir. Killed processes may have started others
// in between, hence the rounds.
func cleanup(dir string, ownerPID int) {
	for range 5 {
		pids := using(dir, ownerPID)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		deadline := time.Now().Add(5 * time.Second)
		for _, pid := range pids {
			for alive(pid) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	_ = os.RemoveAll(dir)
}

// using lists the processes, other than watchdogs and the owner, that name dir in their
// command line or environment.
func using(dir string, ownerPID int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || pid == ownerPID {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(environ, []byte(watchdogEnv+"=")) {
			continue
		}
		if names(cmdline, dir) || names(environ, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// names reports whether data (NUL-separated strings) holds path dir or a path under it, not
// merely a longer name that starts the same (dir-1 for dir-12).
func names(data []byte, dir string) bool {
	d := []byte(dir)
	for i := bytes.Index(data, d); i >= 0; {
		end := i + len(d)
		if end == len(data) || bytes.IndexByte([]byte{'/', 0, ':', '\'', '"', ' '}, data[end]) >= 0 {
			return true
		}
		next := bytes.Index(data[end:], d)
		if next < 0 {
			return false
		}
		i = end + next
	}
	return false
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold any byte.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
