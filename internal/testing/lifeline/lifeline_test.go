package lifeline

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary plays the owner and its children too, chosen by roleEnv.
const roleEnv = "LIFELINE_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "sleeper": // a child that names the directory in its arguments
		time.Sleep(time.Hour)
		os.Exit(0)
	case "owner": // makes the directory, a lifeline, and two children; then waits to be killed
		dir, err := os.MkdirTemp(os.Args[1], "owned-")
		if err != nil {
			panic(err)
		}
		if _, err := Start(dir); err != nil {
			panic(err)
		}
		inside := sleeper(filepath.Join(dir, "data"))
		byEnv := sleeper("")
		byEnv.Env = append(byEnv.Env, "TMPDIR="+dir)
		for _, c := range []*exec.Cmd{inside, byEnv} {
			if err := c.Start(); err != nil {
				panic(err)
			}
		}
		fmt.Printf("%s %d %d\n", dir, inside.Process.Pid, byEnv.Process.Pid)
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func sleeper(arg string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$", arg)
	cmd.Env = append(os.Environ(), roleEnv+"=sleeper")
	return cmd
}

// An owner killed with SIGKILL leaves nothing: the processes naming its directory (in an
// argument, in the environment) are killed and the directory is removed; a process naming a
// longer name that starts the same is left alone.
func TestOwnerKilled(t *testing.T) {
	parent := t.TempDir()
	owner := exec.Command(os.Args[0], parent)
	owner.Env = append(os.Environ(), roleEnv+"=owner")
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Process.Kill(); _ = owner.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from the owner: %v", err)
	}
	fields := strings.Fields(line)
	if len(fields) != 3 {
		t.Fatalf("owner said %q", line)
	}
	dir := fields[0]
	var children []int
	for _, f := range fields[1:] {
		pid, _ := strconv.Atoi(f)
		children = append(children, pid)
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	}
	bystander := sleeper(dir + "1")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bystander.Process.Kill(); _ = bystander.Wait() })

	if err := owner.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = owner.Wait() // "signal: killed", as meant
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		left := []int{}
		for _, pid := range children {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if os.IsNotExist(statErr) && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after the owner was killed: directory %s: %v; children still running: %v", dir, statErr, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !alive(bystander.Process.Pid) {
		t.Error("the process naming a longer name was killed too")
	}
}

// Close, on a clean exit, removes what is left and returns once it is gone.
func TestClose(t *testing.T) {
	dir := t.TempDir()
	l, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	child := sleeper(filepath.Join(dir, "x"))
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); _ = child.Wait() })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if alive(child.Process.Pid) {
		t.Error("the child naming the directory still runs after Close")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("directory still there: %v", err)
	}
}

func TestNames(t *testing.T) {
	const dir = "/tmp/devenv-12"
	for data, want := range map[string]bool{
		"/tmp/devenv-12":                         true,
		"etcd\x00--data-dir=/tmp/devenv-12/etcd": true,
		"TMPDIR=/tmp/devenv-12\x00HOME=/root":    true,
		"PATH=/bin:/tmp/devenv-12:/usr/bin":      true,
		"/tmp/devenv-123\x00/tmp/devenv-12x":     false,
		"/tmp/devenv-123\x00/tmp/devenv-12/a":    true,
		"/tmp/devenv-1":                          false,
		"":                                       false,
	} {
		if got := names([]byte(data), dir); got != want {
			t.Errorf("names(%q) = %v, want %v", data, got, want)
		}
	}
}

func TestRelativeDir(t *testing.T) {
	if _, err := Start("relative/dir"); err == nil {
		t.Error("a relative directory was accepted")
	}
}
