// Package modetest is the harness of lanes' mode integration tests: a
// private mount namespace per test binary, testbeds that are always torn
// down, a mode applied to the receiver and reset when the test ends, and
// byte-for-byte snapshots of every knob a mode may touch, to prove a reset
// restores them.
package modetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/internal/pinned"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/testbed"
	"github.com/lanesnet/lanes/topology"
)

// isolatedEnv marks the re-executed test binary that runs in a mount
// namespace of its own.
const isolatedEnv = "LANES_MODE_TEST_MOUNTNS"

// Main runs a package's tests in a private mount namespace (as root),
// naming testbeds prefix<pid>. A BPF mode's plan mounts bpffs at /sys/fs/bpf and its reset unmounts it again,
// journaled per target: on a machine where someone else applies a falcon
// mode at the same time (benchmarks do), their reset would unmount the
// bpffs under this test's pins, and this test's reset would unmount theirs.
// A private mount namespace gives the tests their own mount table: a
// bpffs someone mounted before they started is still there (the same
// filesystem, where each target keeps to its own pin directory), but what
// the tests mount and unmount stays theirs, and nobody else's unmount
// reaches them. Everything the tests check about the mount (present while
// applied, as before after a reset) holds within it. Network namespaces
// are not affected.
func Main(m *testing.M, prefix string) {
	base = prefix
	if os.Geteuid() == 0 && os.Getenv(isolatedEnv) == "" {
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), isolatedEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		// Go remounts / recursively private in the child after
		// unsharing, so no mount propagates either way.
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			os.Exit(0)
		case errors.As(err, &ee) && ee.ExitCode() >= 0:
			os.Exit(ee.ExitCode())
		default:
			fmt.Fprintf(os.Stderr, "running the tests in a private mount namespace: %v\n", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if os.Geteuid() == 0 {
		if left := nsx.List(prefixBase()); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "namespaces left behind: %v\n", left)
			code = 1
		}
	}
	os.Exit(code)
}

// base starts the names of this test binary's testbeds (Main sets it).
var base = "tm"

func prefixBase() string { return fmt.Sprintf("%s%d", base, os.Getpid()%10000) }

var tbSeq atomic.Int32

// UpTestbed builds a testbed under a prefix of this process and tears it
// down when the test ends, pass or fail, checking nothing is left.
func UpTestbed(t *testing.T, topo testbed.Topology) *testbed.Testbed {
	t.Helper()
	return UpTestbedNIC(t, topo, testbed.NICThreaded)
}

// UpTestbedNIC is UpTestbed with the underlay NICs polled as nic says
// (testbed.Config.NIC).
func UpTestbedNIC(t *testing.T, topo testbed.Topology, nic string) *testbed.Testbed {
	t.Helper()
	return UpTestbedConfig(t, testbed.Config{Topology: topo, NIC: nic})
}

// UpTestbedOverlay is UpTestbed with the overlay built by a real daemon
// (testbed.Config.Overlay). Where the daemon is not installed the test is
// skipped, saying why; anything else that fails fails it.
func UpTestbedOverlay(t *testing.T, overlay string) *testbed.Testbed {
	t.Helper()
	if err := testbed.CheckOverlay(overlay); err != nil {
		t.Skipf("%s overlay: %v", overlay, err)
	}
	return UpTestbedConfig(t, testbed.Config{Overlay: overlay})
}

// UpTestbedConfig builds the testbed cfg says (its prefix and IRQ core
// the harness's) under a prefix of this process and tears it down when
// the test ends, pass or fail, checking nothing is left: no namespace, no
// pin directory, no daemon of a real overlay.
func UpTestbedConfig(t *testing.T, cfg testbed.Config) *testbed.Testbed {
	t.Helper()
	testenv.Root(t)
	prefix := fmt.Sprintf("%s%c", prefixBase(), 'a'+rune(tbSeq.Add(1)-1)%26)
	old := testbed.StateDir
	testbed.StateDir = t.TempDir()
	mounted := BPFFSMounted(t)
	pinRoot := filepath.Dir(plan.PinDir(prefix + "-h1"))
	rootBefore := Exists(pinRoot)
	t.Cleanup(func() {
		// Runs after the cleanups of everything applied to the testbed.
		if BPFFSMounted(t) != mounted {
			t.Errorf("bpffs at %s: mounted %v at the end, %v at the start", plan.BPFFS, !mounted, mounted)
		}
		for _, h := range []string{prefix + "-h1", prefix + "-h2"} {
			if Exists(plan.PinDir(h)) {
				t.Errorf("pin directory %s left behind", plan.PinDir(h))
			}
		}
		if !rootBefore && Exists(pinRoot) {
			t.Errorf("%s left behind (absent at the start)", pinRoot)
		}
		if err := testbed.Down(prefix); err != nil {
			t.Errorf("testbed down: %v", err)
		}
		if left := nsx.List(prefix + "-"); len(left) > 0 {
			t.Errorf("testbed down left namespaces behind: %v", left)
		}
		if left := testbed.DaemonsLeft(prefix); len(left) > 0 {
			t.Errorf("testbed down left the overlay's daemons (or their containers) running: pids %v", left)
		}
		for _, d := range []string{filepath.Join(testbed.RunDir, prefix), filepath.Join(testbed.DataDir, prefix)} {
			if Exists(d) {
				t.Errorf("testbed down left %s behind", d)
			}
		}
		testbed.StateDir = old
	})
	cfg.Prefix, cfg.IRQCPU = prefix, 1
	tb, err := testbed.Up(cfg)
	if err != nil {
		t.Fatalf("testbed up: %v", err)
	}
	warm(t, tb)
	return tb
}

// warm resolves every neighbour entry between the two hosts' containers,
// both ways, before any test traffic: a sender holds the first datagrams
// to a cold entry until the ARP reply, and one sent while that queue is
// flushed can overtake them, before any receive path sees a frame (seen
// as "0 after 34" in a stream of a test that ran on a fresh testbed).
// Entries stay usable (stale at worst) for the testbed's lifetime.
func warm(t *testing.T, tb *testbed.Testbed) {
	t.Helper()
	for _, s := range tb.Sender().Containers {
		for _, r := range tb.Receiver().Containers {
			overlaytest.Warm(t, s.NetNS, r.NetNS, r.Addr.Addr())
			overlaytest.Warm(t, r.NetNS, s.NetNS, s.Addr.Addr())
		}
	}
}

// Online returns the online cores; the tests need exactly the layout the
// brief assumes: cores 0 and 1, the IRQ core 1.
func Online(t *testing.T) []int {
	t.Helper()
	testenv.Root(t)
	cpus, err := cpuset.Online()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cpus, 0) || !slices.Contains(cpus, 1) {
		t.Skipf("needs cores 0 and 1 online, have %v", cpus)
	}
	return cpus
}

// BPFFSMounted says whether /sys/fs/bpf is a bpf filesystem.
func BPFFSMounted(t *testing.T) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(plan.BPFFS, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false
		}
		t.Fatal(err)
	}
	return st.Type == unix.BPF_FS_MAGIC
}

func Exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// Snapshot reads every knob any lanes mode might touch on both hosts of
// the testbed, byte for byte: threaded, rps_cpus, rps_flow_cnt and GRO of
// every device in every namespace (containers included), the scheduling and
// affinity of its NAPI threads, the XDP program and the
// tcx programs (both directions) of every device, whether /sys/fs/bpf is a
// bpffs and whether the receiver's pin directory exists.
func Snapshot(t *testing.T, tb *testbed.Testbed) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, h := range tb.Hosts {
		topo, err := topology.Discover(h.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		devs := topo.AllDevices()
		want := 2 + 2*len(h.Containers) // VXLAN, underlay, both ends of each veth
		if h.Bridge != "" {
			want++
		}
		if len(devs) < want {
			t.Fatalf("discovery of %s found only %d devices", h.NetNS, len(devs))
		}
		for _, d := range devs {
			paths := []string{"/sys/class/net/" + d.Name + "/threaded"}
			for _, q := range d.RxQueues {
				paths = append(paths, d.QueuePath(q.Index)+"/rps_cpus", d.QueuePath(q.Index)+"/rps_flow_cnt")
			}
			for _, p := range paths {
				k := knobs.Sysfs(d.NetNS, p)
				b, err := k.Read()
				if err != nil {
					t.Fatal(err)
				}
				out[k.Key()] = string(b)
			}
			// NAPI threads: PRISM orders and pins them.
			for _, th := range d.NAPIThreads {
				for _, k := range []knobs.Knob{knobs.Sched(th.Comm, th.Index), knobs.Affinity(th.Comm, th.Index)} {
					b, err := k.Read()
					if err != nil {
						t.Fatal(err)
					}
					out[k.Key()] = string(b)
				}
			}
			// GRO: PRISM-sync turns it on in containers so their veths
			// take redirected frames.
			// TSO and queue counts: prism's veth-queues=class changes
			// both on veths.
			for _, k := range []knobs.Knob{knobs.Feature(d.NetNS, d.Name, ethtool.GRO), knobs.Features(d.NetNS, d.Name, knobs.TSOFeatures...), knobs.Channels(d.NetNS, d.Name)} {
				b, err := k.Read()
				if err != nil {
					if k.Kind() == knobs.Channels("", "").Kind() && errors.Is(err, unix.EOPNOTSUPP) {
						continue // bridges, VXLAN: no queue counts to set
					}
					t.Fatal(err)
				}
				out[k.Key()] = string(b)
			}
			id, err := attach.Attached(d.NetNS, d.Name)
			if err != nil {
				t.Fatal(err)
			}
			out["xdp:"+d.NetNS+":"+d.Name] = strconv.FormatUint(uint64(id), 10)
			for dir, at := range map[string]ebpf.AttachType{"ingress": ebpf.AttachTCXIngress, "egress": ebpf.AttachTCXEgress} {
				out["tcx:"+d.NetNS+":"+d.Name+":"+dir] = TCXProgs(t, d.NetNS, d.Name, at)
			}
			// The root qdisc: mflow's reassembler replaces it.
			out["qdisc:"+d.NetNS+":"+d.Name] = RootQdisc(t, d.NetNS, d.Name)
		}
	}
	// The host-wide sysctl a mode may set (prism's netdev-budget).
	budget := knobs.Sysctl("", "net.core.netdev_budget")
	b, err := budget.Read()
	if err != nil {
		t.Fatal(err)
	}
	out[budget.Key()] = string(b)
	out["bpffs:"+plan.BPFFS] = strconv.FormatBool(BPFFSMounted(t))
	dir := plan.PinDir(tb.Receiver().NetNS)
	out["pindir:"+dir] = strconv.FormatBool(Exists(dir))
	return out
}

// RootQdisc names the kind of a device's root qdisc ("" for none).
func RootQdisc(t *testing.T, ns, dev string) string {
	t.Helper()
	var kind string
	err := netnsx.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			return err
		}
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_ROOT {
				kind = q.Type()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("root qdisc of %s in %s: %v", dev, ns, err)
	}
	return kind
}

// TCXProgs lists the ids of the tcx programs on a device, "" for none.
func TCXProgs(t *testing.T, ns, dev string, at ebpf.AttachType) string {
	t.Helper()
	var ids []string
	err := netnsx.Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: at})
		if err != nil {
			return err
		}
		for _, p := range q.Programs {
			ids = append(ids, fmt.Sprint(p.ID))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("tcx programs of %s in %s: %v", dev, ns, err)
	}
	return strings.Join(ids, ",")
}

func SameSnapshot(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if g, ok := got[k]; !ok || g != want[k] {
			t.Errorf("%s: %s = %q, want %q", what, k, g, want[k])
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: new knob %s = %q", what, k, got[k])
		}
	}
}

// NoState checks that a state directory holds nothing: no target
// directory, no journal, no state file.
func NoState(t *testing.T, stateDir string) {
	t.Helper()
	ents, err := os.ReadDir(stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		var inside []string
		if e.IsDir() {
			sub, _ := os.ReadDir(stateDir + "/" + e.Name())
			for _, f := range sub {
				inside = append(inside, f.Name())
			}
		}
		t.Errorf("state left in %s: %s (holding %q)", stateDir, e.Name(), inside)
	}
}

// Applied is a mode applied to the receiver of a testbed.
type Applied struct {
	TB       *testbed.Testbed
	NS       string // the receiver's namespace
	StateDir string
	PinDir   string
	State    *control.State
	reset    bool
}

// Apply applies mode to the receiver and resets it when the test ends
// unless the test reset it itself (ResetAndCheck).
func Apply(t *testing.T, tb *testbed.Testbed, mode string, params map[string]string) *Applied {
	t.Helper()
	a := &Applied{TB: tb, NS: tb.Receiver().NetNS, StateDir: t.TempDir()}
	a.PinDir = plan.PinDir(a.NS)
	st, err := control.Apply(control.Options{Mode: mode, NetNS: a.NS, StateDir: a.StateDir, Params: params})
	// Registered before checking err: a failed apply must leave nothing,
	// and a reset of nothing is harmless.
	t.Cleanup(func() {
		if a.reset {
			return
		}
		if _, err := control.Reset(a.NS, a.StateDir); err != nil {
			t.Errorf("cleanup reset of %s: %v", mode, err)
		}
		if Exists(a.PinDir) {
			t.Errorf("cleanup: pin directory %s left behind", a.PinDir)
		}
		NoState(t, a.StateDir)
	})
	if err != nil {
		t.Fatalf("apply %s: %v", mode, err)
	}
	if st.Phase != control.Applied || st.Mode != mode {
		t.Fatalf("apply %s: state %+v", mode, st)
	}
	a.State = st
	return a
}

// Reset resets the mode now, without checks (the cleanup then skips it).
func (a *Applied) Reset(t *testing.T) {
	t.Helper()
	a.reset = true
	if _, err := control.Reset(a.NS, a.StateDir); err != nil {
		t.Fatalf("reset of %s: %v", a.State.Mode, err)
	}
}

// ResetAndCheck resets the mode and checks that everything is as in
// before: every knob, no XDP, no pin directory, bpffs as before, no state.
func (a *Applied) ResetAndCheck(t *testing.T, before map[string]string) {
	t.Helper()
	res, err := control.Reset(a.NS, a.StateDir)
	a.reset = true
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	if res.Nothing || res.Mode != a.State.Mode {
		t.Errorf("reset result %+v: want %s restored", res, a.State.Mode)
	}
	if res.Report != nil && len(res.Report.Restored) != a.State.Plan.Changes {
		t.Errorf("reset restored %d knobs, the apply made %d changes", len(res.Report.Restored), a.State.Plan.Changes)
	}
	SameSnapshot(t, "after reset of "+a.State.Mode, Snapshot(t, a.TB), before)
	if id, err := attach.Attached(a.NS, a.TB.Receiver().Underlay); err != nil || id != 0 {
		t.Errorf("after reset: XDP program %d on %s (%v)", id, a.TB.Receiver().Underlay, err)
	}
	if Exists(a.PinDir) {
		t.Errorf("after reset: pin directory %s still exists", a.PinDir)
	}
	NoState(t, a.StateDir)
}

// Open opens the applied datapath; closed when the test ends (before the
// reset of the cleanup).
func (a *Applied) Open(t *testing.T) *steer.Datapath {
	t.Helper()
	dp, err := steer.Open(a.PinDir)
	if err != nil {
		t.Fatalf("opening the pinned datapath: %v", err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp
}

// OneLine checks an error is there, on one line, and says want.
func OneLine(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error, want one containing %q", what, want)
	case !strings.Contains(err.Error(), want):
		t.Errorf("%s: error %q does not say %q", what, err, want)
	case strings.Contains(err.Error(), "\n"):
		t.Errorf("%s: error is not one line: %q", what, err)
	}
}

// StartAgent runs the applied mode's agent until the returned stop, which
// cancels it, waits for it to return and reports a failure of its Run (it
// also runs at cleanup if the test did not call it).
func (a *Applied) StartAgent(t *testing.T) (ag plan.Agent, stop func()) {
	t.Helper()
	ag, _, err := control.NewAgent(control.AgentOptions{NetNS: a.NS, StateDir: a.StateDir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ag, stop
}

// Prio opens the priority rule set of netns (a prio mode must be applied)
// and closes it when the test ends.
func Prio(t *testing.T, netns string) *control.PrioSet {
	t.Helper()
	set, err := control.OpenPrio(netns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	return set
}

// Rule parses a `lanes prio` rule the test writes itself.
func Rule(t *testing.T, spec string) steer.Rule {
	t.Helper()
	r, err := steer.ParseRule(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Every calls op(0), op(1), ... every interval on a goroutine of its own
// until the returned stop is called; stop waits for it and returns how
// many calls were made and the first error (a test flipping tables or
// rules while traffic runs).
func Every(interval time.Duration, op func(i int) error) (stop func() (int, error)) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var first error
	n := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := op(i); err != nil && first == nil {
				first = err
			}
			n++
			time.Sleep(interval)
		}
	}()
	return func() (int, error) {
		close(done)
		wg.Wait()
		return n, first
	}
}

// Hog keeps core busy with a normal-priority thread of this process until
// the returned stop is called: a task that leaves SCHED_IDLE work on that
// core (prism's bulk queue) next to nothing, as a busy application would.
// Tests use it to starve a queue's kthread for longer than any timeout.
func Hog(t *testing.T, core int) (stop func()) {
	t.Helper()
	var done atomic.Bool
	started, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		err := pinned.Here(core)
		started <- err
		if err != nil {
			return
		}
		for x := 0; !done.Load(); x++ {
		}
	}()
	if err := <-started; err != nil {
		t.Fatalf("pinning a busy thread to core %d: %v", core, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			done.Store(true)
			<-finished
		})
	}
	t.Cleanup(stop)
	return stop
}

// DropFrames attaches, ahead of every other tcx program on dev in ns, a
// program that drops (TC_ACT_SHOT, which the kernel reports through
// skb:kfree_skb, almost always: Dropper.Reported) every frame of length
// frameLen, until the test ends, and returns its per-CPU drop count.
func DropFrames(t *testing.T, ns, dev string, at ebpf.AttachType, frameLen uint32) *Dropper {
	t.Helper()
	return DropFramesAt(t, ns, dev, at, frameLen, link.Head())
}

// Dropper is a program DropFrames attached.
type Dropper struct {
	m, reported *ebpf.Map
	l           link.Link
	close       sync.Once
}

// Dropped is how many frames it dropped.
func (d *Dropper) Dropped(t *testing.T) uint64 { return SumPerCPU(t, d.m) }

// Detach takes it off its device (before a reset is checked, say); the
// test's end does too.
func (d *Dropper) Detach() { d.close.Do(func() { d.l.Close() }) }

// Reported is how many of its drops the kernel reported through
// skb:kfree_skb, the tracepoint lanes counts drops out with. Not every
// drop is: now and then some frames the dropper dropped (never more than
// one burst of the stream) produce no skb:kfree_skb event at all (perf
// shows none), which happens when the skb still has another user as the
// dropper's verdict frees it; the frame is then freed later without a
// drop event. Such a drop is the kernel's to report; lanes leaves its flow
// on the drain time.
func (d *Dropper) Reported(t *testing.T) uint64 { return SumPerCPU(t, d.reported) }

var dropperSeq atomic.Uint32

// DropFramesAt is DropFrames at a given place among the device's programs.
func DropFramesAt(t *testing.T, ns, dev string, at ebpf.AttachType, frameLen uint32, where link.Anchor) *Dropper {
	t.Helper()
	m := PerCPUCounter(t)
	// The dropper marks what it drops (skb->mark), so that a tracer of
	// its own can count which of its drops the kernel reports.
	mark := 0x1a9e0000 | dropperSeq.Add(1)&0xffff
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // skb->len
		asm.JNE.Imm(asm.R2, int32(frameLen), "pass"),
		asm.Mov.Reg(asm.R6, asm.R1),
	}
	insns = append(insns, IncCounter(m, "drop")...)
	insns = append(insns,
		asm.Mov.Imm32(asm.R1, int32(mark)).WithSymbol("drop"),
		asm.StoreMem(asm.R6, int16(skbMarkOffset), asm.R1, asm.Word), // __sk_buff.mark
		asm.Mov.Imm(asm.R0, 2), // TC_ACT_SHOT
		asm.Return(),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"), // TCX_NEXT
		asm.Return(),
	)
	d := &Dropper{m: m, reported: countReportedDrops(t, mark)}
	d.l = AttachTCX(t, ns, dev, "drop_len", insns, at, where)
	t.Cleanup(d.Detach)
	return d
}

// skbMarkOffset is the offset of mark in struct __sk_buff (the uapi
// context of tc programs): after len, pkt_type, mark.
const skbMarkOffset = 8

// countReportedDrops attaches, until the test ends, a program on
// skb:kfree_skb counting the drops of skbs whose mark is mark.
func countReportedDrops(t *testing.T, mark uint32) *ebpf.Map {
	t.Helper()
	off := kernelSkbMarkOffset(t)
	m := PerCPUCounter(t)
	insns := asm.Instructions{
		asm.LoadMem(asm.R3, asm.R1, 0, asm.DWord), // args[0]: the skb
		asm.Add.Imm(asm.R3, int32(off)),
		asm.Mov.Reg(asm.R1, asm.R10),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 4),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R10, -8, asm.Word),
		asm.JNE.Imm32(asm.R1, int32(mark), "out"),
	}
	insns = append(insns, IncCounter(m, "out")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "drops_reported", Type: ebpf.RawTracepoint, Instructions: insns, License: "GPL"})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "kfree_skb", Program: prog})
	if err != nil {
		t.Fatalf("attaching to skb:kfree_skb: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return m
}

// kernelSkbMarkOffset is the offset of mark in the kernel's struct
// sk_buff, from the kernel's BTF (it sits in an anonymous union).
func kernelSkbMarkOffset(t *testing.T) uint32 {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("reading the kernel's BTF: %v", err)
	}
	var skb *btf.Struct
	if err := spec.TypeByName("sk_buff", &skb); err != nil {
		t.Fatalf("struct sk_buff in the kernel's BTF: %v", err)
	}
	off, ok := memberOffset(skb.Members, "mark")
	if !ok {
		t.Fatal("struct sk_buff has no member mark in the kernel's BTF")
	}
	return off
}

// memberOffset finds a member by name, also inside anonymous structs and
// unions, and returns its byte offset.
func memberOffset(members []btf.Member, name string) (uint32, bool) {
	for _, mb := range members {
		if mb.Name == name {
			return mb.Offset.Bytes(), true
		}
		if mb.Name != "" {
			continue
		}
		var inner []btf.Member
		switch ty := btf.UnderlyingType(mb.Type).(type) {
		case *btf.Struct:
			inner = ty.Members
		case *btf.Union:
			inner = ty.Members
		}
		if off, ok := memberOffset(inner, name); ok {
			return mb.Offset.Bytes() + off, true
		}
	}
	return 0, false
}

// PerCPUCounter is a one-entry per-CPU counter map, closed when the test
// ends.
func PerCPUCounter(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// IncCounter is the instructions that add one to a PerCPUCounter's entry
// (they clobber R0-R5 and go on at the label next, which follows them).
func IncCounter(m *ebpf.Map, next string) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, next),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
	}
}

// AttachTCX loads a tc program of insns and attaches it to dev in ns (at:
// ingress or egress; where: its place among the device's programs, nil
// for last) until the test ends, which returns the link.
func AttachTCX(t *testing.T, ns, dev, name string, insns asm.Instructions, at ebpf.AttachType, where link.Anchor) link.Link {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, Instructions: insns, License: "MIT"})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	var l link.Link
	err = nsx.Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifi.Index, Program: prog, Attach: at, Anchor: where})
		return err
	})
	if err != nil {
		t.Fatalf("attaching %s to %s in %s: %v", name, dev, ns, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// SumPerCPU is the sum over cores of a one-entry per-CPU counter map.
func SumPerCPU(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}
