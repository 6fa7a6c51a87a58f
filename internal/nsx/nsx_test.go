package nsx

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/testenv"
)

// testNS creates the namespace name for t, removed when t ends.
func testNS(t *testing.T, name string) string {
	t.Helper()
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(name) })
	return name
}

func TestDoSysfsSeesNamespaceDevices(t *testing.T) {
	testenv.Root(t)
	name := testNS(t, "lanes-nsx-test")

	var ents []os.DirEntry
	err := DoSysfs(name, func() error {
		var err error
		ents, err = os.ReadDir("/sys/class/net")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "lo" {
		t.Fatalf("netns sysfs shows %v, want only lo", ents)
	}
	// The calling thread's view is unchanged.
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		t.Fatalf("root /sys lost: %v", err)
	}
}

// SysfsAt shows a namespace's own devices through one detached mount
// kept across calls (a second call mounts nothing), another namespace's
// through another, and the process's own /sys stays as it was.
func TestSysfsAtKeepsOneMountPerNamespace(t *testing.T) {
	testenv.Root(t)
	a := testNS(t, "lanes-nsx-at1")
	b := testNS(t, "lanes-nsx-at2")
	if err := Do(b, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"})
	}); err != nil {
		t.Fatal(err)
	}
	list := func(name string) (root string, devs []string) {
		t.Helper()
		err := SysfsAt(name, func(sys string) error {
			root = sys
			ents, err := os.ReadDir(sys + "/class/net")
			for _, e := range ents {
				devs = append(devs, e.Name())
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return root, devs
	}
	mountsBefore := countMounts(t)
	rootA, devsA := list(a)
	if !slices.Equal(devsA, []string{"lo"}) {
		t.Errorf("%s's sysfs shows %v, want [lo]", a, devsA)
	}
	rootB, devsB := list(b)
	if !slices.Equal(devsB, []string{"d0", "d1", "lo"}) {
		t.Errorf("%s's sysfs shows %v, want [d0 d1 lo]", b, devsB)
	}
	if again, _ := list(a); again != rootA || rootA == rootB {
		t.Errorf("roots %s, %s, then %s for the first again: want one kept mount per namespace", rootA, rootB, again)
	}
	if n := countMounts(t); n != mountsBefore {
		t.Errorf("the process's mount table went from %d to %d entries: a detached mount is in none", mountsBefore, n)
	}
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		t.Fatalf("root /sys lost: %v", err)
	}
}

// A mount that has gone unused for sysfsKeep is let go, but never while a
// caller still reads through it (its fd number would be reused).
func TestSysfsAtLetsGoOnlyUnheldMounts(t *testing.T) {
	testenv.Root(t)
	a := testNS(t, "lanes-nsx-hold1")
	b := testNS(t, "lanes-nsx-hold2")
	old := sysfsKeep
	sysfsKeep = 0
	t.Cleanup(func() { sysfsKeep = old })
	err := SysfsAt(a, func(sys string) error {
		// a's mount is held while b's call sweeps the unused ones.
		if err := SysfsAt(b, func(string) error { return nil }); err != nil {
			return err
		}
		_, err := os.Stat(sys + "/class/net/lo")
		return err
	})
	if err != nil {
		t.Fatalf("reading a held mount after a sweep: %v", err)
	}
	var rootA string
	SysfsAt(a, func(sys string) error { rootA = sys; return nil })
	var left int
	SysfsAt(b, func(string) error {
		sysfsMounts.Lock()
		left = len(sysfsMounts.byCookie)
		sysfsMounts.Unlock()
		return nil
	})
	if left != 1 {
		t.Errorf("%d mounts kept after a's went unused (root %s), want b's alone", left, rootA)
	}
}

func countMounts(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func TestStartInheritsNamespace(t *testing.T) {
	testenv.Root(t)
	name := testNS(t, "lanes-nsx-test2")
	out, err := Output(name, "cat", "/proc/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(out), ":") != 1 {
		t.Fatalf("child sees devices of another namespace:\n%s", out)
	}
	_ = exec.Command
}

// A namespace whose file is not there is ErrNoNetNS, for both kinds of
// entry, and the function never runs; DoHandle runs in the handle's
// namespace.
func TestMissingNamespace(t *testing.T) {
	testenv.Root(t)
	ran := false
	for _, do := range []func(string, func() error) error{Do, DoSysfs} {
		err := do("lanes-nsx-no-such-namespace", func() error { ran = true; return nil })
		if !errors.Is(err, ErrNoNetNS) {
			t.Errorf("entering a missing namespace: %v, want ErrNoNetNS", err)
		}
	}
	if ran {
		t.Error("the function ran")
	}
	name := testNS(t, "lanes-nsx-handle")
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var inside netns.NsHandle
	if err := DoHandle(h, func() (err error) { inside, err = netns.Get(); return err }); err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if !inside.Equal(h) {
		t.Errorf("DoHandle ran in %s, want %s", inside, h)
	}
}

// A container runtime that mounts a namespace's sysfs read-only first
// makes its one superblock read-only; DoSysfs still writes (through its
// own mount), puts the superblock back read-only, and the runtime's mount
// never becomes writable.
func TestDoSysfsWritesThroughReadOnlySuperblock(t *testing.T) {
	testenv.Root(t)
	name := testNS(t, "lanes-nsx-test3")
	const knob = "/class/net/lo/queues/rx-0/rps_cpus"

	// The runtime: a thread in a mount namespace of its own that holds
	// the namespace's sysfs mounted read-only until the test ends.
	dir := t.TempDir()
	type probe struct {
		readOnly bool
		writeErr error
	}
	ask, answers, ready := make(chan struct{}), make(chan probe), make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		err := func() error {
			if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
				return err
			}
			h, err := netns.GetFromName(name)
			if err != nil {
				return err
			}
			defer h.Close()
			if err := netns.Set(h); err != nil {
				return err
			}
			return unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY, "")
		}()
		ready <- err
		if err != nil {
			return
		}
		for range ask {
			var st unix.Statfs_t
			unix.Statfs(dir, &st)
			err := os.WriteFile(dir+knob, []byte("0"), 0)
			answers <- probe{readOnly: st.Flags&unix.ST_RDONLY != 0, writeErr: err}
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("mounting the runtime's read-only sysfs: %v", err)
	}
	defer close(ask)
	look := func() probe { ask <- struct{}{}; return <-answers }
	if p := look(); !p.readOnly || !errors.Is(p.writeErr, unix.EROFS) {
		t.Fatalf("the runtime's sysfs: read-only %v, write error %v; want a read-only superblock", p.readOnly, p.writeErr)
	}

	var got []byte
	err := DoSysfs(name, func() error {
		if err := os.WriteFile("/sys"+knob, []byte("1"), 0); err != nil {
			return err
		}
		var err error
		got, err = os.ReadFile("/sys" + knob)
		return err
	})
	if err != nil {
		t.Fatalf("writing through DoSysfs: %v", err)
	}
	if strings.TrimSpace(string(got)) != "1" {
		t.Fatalf("rps_cpus reads %q after writing 1", got)
	}
	if p := look(); !p.readOnly || !errors.Is(p.writeErr, unix.EROFS) {
		t.Fatalf("after DoSysfs the runtime's sysfs: read-only %v, write error %v; want it read-only as before", p.readOnly, p.writeErr)
	}
}

// A runtime that unmounts a namespace's bind mount may leave the empty
// file: that namespace is gone (ErrNoNetNS), not an error of entering it.
func TestUnboundFileIsNoNamespace(t *testing.T) {
	testenv.Root(t)
	p := t.TempDir() + "/netns"
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if Exists(p) {
		t.Errorf("Exists(%s) on an empty file", p)
	}
	ran := false
	err := Do(p, func() error { ran = true; return nil })
	if !errors.Is(err, ErrNoNetNS) || ran {
		t.Errorf("Do on an empty file: %v (ran %v), want ErrNoNetNS", err, ran)
	}
}

// Work in a namespace runs at the caller's scheduling policy: a
// SCHED_IDLE round's namespace hops stay SCHED_IDLE, and a caller at
// normal policy gets normal policy.
func TestDoRunsAtCallerPolicy(t *testing.T) {
	testenv.Root(t)
	name := testNS(t, "lanes-nsx-test4")
	policy := func(p *uint32) func() error {
		return func() error {
			a, err := unix.SchedGetAttr(0, 0)
			if err != nil {
				return err
			}
			*p = a.Policy
			return nil
		}
	}
	h, err := open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	hops := func() (do, sysfs, handle uint32, err error) {
		err = errors.Join(Do(name, policy(&do)), DoSysfs(name, policy(&sysfs)), DoHandle(h, policy(&handle)))
		return
	}
	var do, sysfs, handle uint32
	var herr error
	if err := kthread.OnThread(unix.SCHED_IDLE, func() { do, sysfs, handle, herr = hops() }); err != nil {
		t.Fatal(err)
	}
	if herr != nil {
		t.Fatal(herr)
	}
	for hop, p := range map[string]uint32{"Do": do, "DoSysfs": sysfs, "DoHandle": handle} {
		if p != unix.SCHED_IDLE {
			t.Errorf("%s from a SCHED_IDLE thread ran at policy %d, want SCHED_IDLE (%d)", hop, p, unix.SCHED_IDLE)
		}
	}
	do, sysfs, handle, herr = hops()
	if herr != nil {
		t.Fatal(herr)
	}
	for hop, p := range map[string]uint32{"Do": do, "DoSysfs": sysfs, "DoHandle": handle} {
		if p != unix.SCHED_NORMAL {
			t.Errorf("%s from a normal goroutine ran at policy %d, want SCHED_NORMAL", hop, p)
		}
	}
}
