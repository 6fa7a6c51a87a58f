package attach_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	nsSeq  atomic.Int32
	mntsMu sync.Mutex
	mnts   []string // every bpffs a test mounted, checked by TestMain
)

func nsPrefix() string { return fmt.Sprintf("lanes-attach-test-%d-", os.Getpid()) }

// TestMain fails the run when a test left a namespace or a mount behind,
// which a test's own cleanup cannot see once it has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if left := nsx.List(nsPrefix()); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "namespaces left behind: %v\n", left)
		code = 1
	}
	mounted := mountPoints()
	for _, p := range mnts {
		if mounted[p] {
			fmt.Fprintf(os.Stderr, "mount left behind: %s\n", p)
			code = 1
		}
	}
	os.Exit(code)
}

// testNetns makes a namespace with a veth pair veth0/veth1, both up, and
// deletes it when the test ends.
func testNetns(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("%s%d", nsPrefix(), nsSeq.Add(1))
	if err := nsx.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nsx.Delete(ns); err != nil {
			t.Error(err)
		}
	})
	addVeth(t, ns)
	return ns
}

func addVeth(t *testing.T, ns string) {
	t.Helper()
	err := netnsx.Do(ns, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0"}, PeerName: "veth1"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		for _, n := range []string{"veth0", "veth1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("veth in %s: %v", ns, err)
	}
}

func delVeth(t *testing.T, ns string) {
	t.Helper()
	err := netnsx.Do(ns, func() error {
		l, err := netlink.LinkByName("veth0")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testBPFFS mounts a private bpffs, so tests never touch the host's pins;
// unmounting it in cleanup frees whatever a failed test pinned there.
func testBPFFS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting bpffs: %v", err)
	}
	trackMount(t, dir)
	return dir
}

// trackMount unmounts dir (if still a mount) at cleanup and has TestMain
// check it is gone.
func trackMount(t *testing.T, dir string) {
	mntsMu.Lock()
	mnts = append(mnts, dir)
	mntsMu.Unlock()
	t.Cleanup(func() {
		for mountPoints()[dir] {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", dir, err)
				return
			}
		}
	})
}

// mountPoints lists the mount points of this mount namespace.
func mountPoints() map[string]bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		panic(err)
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 {
			out[fs[4]] = true
		}
	}
	return out
}

func countMounts(dir string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		panic(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if fs := strings.Fields(l); len(fs) > 4 && fs[4] == dir {
			n++
		}
	}
	return n
}

var (
	xdpPass = asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}  // XDP_PASS
	tcNext  = asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()} // TC_ACT_UNSPEC / TCX_NEXT
)

func newProg(t *testing.T, typ ebpf.ProgramType, name string) *ebpf.Program {
	t.Helper()
	insns := xdpPass
	if typ == ebpf.SchedCLS {
		insns = tcNext
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: typ, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatalf("loading %s: %v", name, err)
	}
	return p
}

// pinProg loads a program and pins it at path, as the loader would; it
// returns the program's id.
func pinProg(t *testing.T, typ ebpf.ProgramType, name, path string) ebpf.ProgramID {
	t.Helper()
	p := newProg(t, typ, name)
	defer p.Close()
	if err := p.Pin(path); err != nil {
		t.Fatal(err)
	}
	return progID(t, p)
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// pinProgs pins an XDP and a SCHED_CLS program into dir.
func pinProgs(t *testing.T, dir string) (xdp, tc string) {
	t.Helper()
	xdp, tc = filepath.Join(dir, "xdp_prog"), filepath.Join(dir, "tc_prog")
	pinProg(t, ebpf.XDP, "lanes_t_xdp", xdp)
	pinProg(t, ebpf.SchedCLS, "lanes_t_tc", tc)
	return xdp, tc
}

func read(t *testing.T, k knobs.Knob) string {
	t.Helper()
	b, err := k.Read()
	if err != nil {
		t.Fatalf("reading %s: %v", k.Key(), err)
	}
	return string(b)
}

func wantRead(t *testing.T, k knobs.Knob, want string) {
	t.Helper()
	if got := read(t, k); got != want {
		t.Fatalf("%s reads %q, want %q", k.Key(), got, want)
	}
}

func write(t *testing.T, k knobs.Knob, v string) {
	t.Helper()
	if err := k.Write([]byte(v)); err != nil {
		t.Fatalf("writing %q to %s: %v", v, k.Key(), err)
	}
}

// jsonRoundTrip checks that k survives the journal's encoding: decoded
// into zero, it is the same setting and reads the same.
func jsonRoundTrip(t *testing.T, k, zero knobs.Knob) {
	t.Helper()
	b, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, zero); err != nil {
		t.Fatal(err)
	}
	if zero.Kind() != k.Kind() || zero.Key() != k.Key() {
		t.Fatalf("decoded %s as %s/%s", b, zero.Kind(), zero.Key())
	}
	if a, b := read(t, k), read(t, zero); a != b {
		t.Fatalf("decoded %s reads %q, original %q", k.Key(), b, a)
	}
}

func gone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still exists (%v)", path, err)
	}
}

func exists(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
}

func xdpID(t *testing.T, ns, dev string) uint32 {
	t.Helper()
	id, err := attach.Attached(ns, dev)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// tcxProgs lists the programs on dev's tcx hook at, queried in ns.
func tcxProgs(t *testing.T, ns, dev string, at ebpf.AttachType) []ebpf.ProgramID {
	t.Helper()
	var ids []ebpf.ProgramID
	err := netnsx.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
		if err != nil {
			return err
		}
		for _, p := range q.Programs {
			ids = append(ids, p.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
