package netnsx_test

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology/topotest"
)

func TestPathForms(t *testing.T) {
	testenv.Root(t)
	name := topotest.Namespace(t, topotest.NewPrefix()+"-path")
	ino := func(ns string) uint64 {
		var st syscall.Stat_t
		err := netnsx.Do(ns, func() error { return syscall.Stat("/proc/thread-self/ns/net", &st) })
		if err != nil {
			t.Fatalf("entering %q: %v", ns, err)
		}
		return st.Ino
	}
	want := ino(name)
	if got := ino("/run/netns/" + name); got != want {
		t.Errorf("by path: inode %d, want %d", got, want)
	}
	if got := ino("pid:" + strconv.Itoa(os.Getpid())); got == want {
		t.Errorf("pid form entered the named namespace")
	}
	if err := netnsx.Do("/run/netns/lanes-nope-x", func() error { return nil }); err == nil {
		t.Error("entering a missing namespace succeeded")
	}
}

// TestPinnedPIDNetNS: "pid:N" is pinned to its namespace's cookie. The
// pinned label names that namespace while any process holds it: once N
// exited, lanes enters it through another of its processes (a namespace
// outlives its first process, and its knobs must still be restored). Once
// no process holds it, the label is gone for every way lanes enters it,
// also when N now belongs to a process of another namespace (a PID reused
// by another container), so nothing is restored or adopted there. The
// reuse is modelled by a label naming a process of namespace b with
// namespace a's cookie.
func TestPinnedPIDNetNS(t *testing.T) {
	testenv.Root(t)
	p := topotest.NewPrefix()
	start := func(n string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command("sleep", "600")
		if err := nsx.Start(n, cmd); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	topotest.Namespace(t, p+"-a")
	topotest.Namespace(t, p+"-b")
	a1, a2, a3, b := start(p+"-a"), start(p+"-a"), start(p+"-a"), start(p+"-b")
	pinA, err := netnsx.Pin("pid:" + strconv.Itoa(a1.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	pinB, err := netnsx.Pin("pid:" + strconv.Itoa(b.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	_, cookieA, _ := strings.Cut(pinA, "@")
	_, cookieB, _ := strings.Cut(pinB, "@")
	if cookieA == "" || cookieA == cookieB {
		t.Fatalf("pinned %q and %q: want pid:N@COOKIE with different cookies", pinA, pinB)
	}
	if again, err := netnsx.Pin(pinA); err != nil || again != pinA {
		t.Errorf("Pin(%q) = %q, %v; want it unchanged", pinA, again, err)
	}
	for _, ns := range []string{"", p + "-a", "/run/netns/" + p + "-a"} {
		if got, err := netnsx.Pin(ns); err != nil || got != ns {
			t.Errorf("Pin(%q) = %q, %v; want it unchanged", ns, got, err)
		}
	}
	// The namespace's own inode, to tell where a function ran.
	ino := func(ns string) (uint64, error) {
		var st syscall.Stat_t
		err := netnsx.Do(ns, func() error { return syscall.Stat("/proc/thread-self/ns/net", &st) })
		return st.Ino, err
	}
	inoA, err := ino(p + "-a")
	if err != nil {
		t.Fatal(err)
	}
	entered := func(label string) {
		t.Helper()
		if !netnsx.Exists(label) {
			t.Errorf("%s does not exist", label)
		}
		if got, err := ino(label); err != nil || got != inoA {
			t.Errorf("entering %s: inode %d (%v), want namespace a's %d", label, got, err, inoA)
		}
		ran := false
		if err := netnsx.DoSysfs(label, func() error { ran = true; return nil }); err != nil || !ran {
			t.Errorf("entering %s with sysfs: %v", label, err)
		}
		h, err := netnsx.Open(label)
		if err != nil {
			t.Errorf("opening %s: %v", label, err)
			return
		}
		h.Close()
	}
	entered(pinA)
	// A label with a's cookie and another process's PID still names a,
	// while a lives.
	reused := "pid:" + strconv.Itoa(b.Process.Pid) + "@" + cookieA
	entered(reused)
	// a's first process exits; a lives on in the others. Then the one
	// lanes found and remembers exits too; a lives on in the third.
	for _, gone := range []*exec.Cmd{a1, a2} {
		gone.Process.Kill()
		gone.Wait()
		entered(pinA)
	}
	// No process holds a any more: gone, however it is entered, and
	// nothing runs in b through the label naming b's process.
	a3.Process.Kill()
	a3.Wait()
	for _, label := range []string{pinA, reused} {
		if netnsx.Exists(label) {
			t.Errorf("%s exists with no process in it", label)
		}
		ran := false
		for name, err := range map[string]error{
			"Do":      netnsx.Do(label, func() error { ran = true; return nil }),
			"DoSysfs": netnsx.DoSysfs(label, func() error { ran = true; return nil }),
		} {
			if !errors.Is(err, netnsx.ErrGone) {
				t.Errorf("%s into %s: %v, want ErrGone", name, label, err)
			}
		}
		if ran {
			t.Errorf("a function ran through %s", label)
		}
		if h, err := netnsx.Open(label); err == nil {
			h.Close()
			t.Errorf("opened %s", label)
		}
	}
	if _, err := netnsx.Pin("pid:" + strconv.Itoa(a1.Process.Pid)); !errors.Is(err, netnsx.ErrGone) {
		t.Errorf("pinning a gone process: %v, want ErrGone", err)
	}
	for _, bad := range []string{"pid:", "pid:x", "pid:-1", "pid:1@", "pid:1@0", "pid:1@x"} {
		if _, err := netnsx.Pin(bad); err == nil {
			t.Errorf("Pin(%q) succeeded", bad)
		}
		if netnsx.Exists(bad) {
			t.Errorf("%q exists", bad)
		}
	}
}
