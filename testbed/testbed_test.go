package testbed

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/internal/testenv"
)

var testSeq int

// upForTest builds a testbed under a prefix of its own and tears it down
// when the test ends, pass or fail.
func upForTest(t *testing.T, cfg Config) *Testbed {
	t.Helper()
	testenv.Root(t)
	if cfg.Prefix == "" {
		testSeq++
		cfg.Prefix = fmt.Sprintf("t%d-%d", os.Getpid()%10000, testSeq)
	}
	old := StateDir
	StateDir = t.TempDir()
	t.Cleanup(func() {
		if err := Down(cfg.Prefix); err != nil {
			t.Errorf("down: %v", err)
		}
		if left := nsx.List(cfg.Prefix + "-"); len(left) > 0 {
			t.Errorf("down left namespaces behind: %v", left)
		}
		StateDir = old
	})
	tb, err := Up(cfg)
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	return tb
}

func tcpTransfer(t *testing.T, srcNS, dstNS string, dst netip.Addr, n int) {
	t.Helper()
	overlaytest.TCP(t, srcNS, dstNS, dst, n)
}

// udpTransfer: overlay UDP over an idle testbed must not drop every
// datagram, and every one that arrives must be intact.
func udpTransfer(t *testing.T, srcNS, dstNS string, dst netip.Addr, size int) {
	t.Helper()
	if overlaytest.UDP(t, srcNS, dstNS, dst, size) == 0 {
		t.Fatalf("UDP %s -> %s: none of %d datagrams arrived", srcNS, dstNS, overlaytest.UDPCount)
	}
}

func TestOverlayCarriesTraffic(t *testing.T) {
	for _, topo := range []Topology{Docker, Flannel} {
		t.Run(string(topo), func(t *testing.T) {
			tb := upForTest(t, Config{Topology: topo})
			a, b := tb.Hosts[0].Containers[0], tb.Hosts[1].Containers[1]
			// First packets wait for ARP; the transfer itself has a deadline.
			tcpTransfer(t, a.NetNS, b.NetNS, b.Addr.Addr(), 4<<20)
			tcpTransfer(t, b.NetNS, a.NetNS, a.Addr.Addr(), 4<<20)
			udpTransfer(t, a.NetNS, b.NetNS, b.Addr.Addr(), 1000)
			udpTransfer(t, b.NetNS, a.NetNS, a.Addr.Addr(), 1000)
			// Larger than the overlay MTU: IP fragments inside VXLAN.
			udpTransfer(t, a.NetNS, b.NetNS, b.Addr.Addr(), 4000)
			// Containers on the same host reach each other too.
			c := tb.Hosts[0].Containers[1]
			tcpTransfer(t, a.NetNS, c.NetNS, c.Addr.Addr(), 1<<20)
		})
	}
}

func TestNativePath(t *testing.T) {
	tb := upForTest(t, Config{})
	s, r := tb.Sender(), tb.Receiver()
	tcpTransfer(t, s.NetNS, r.NetNS, r.UnderlayAddr.Addr(), 4<<20)
	udpTransfer(t, r.NetNS, s.NetNS, s.UnderlayAddr.Addr(), 1400)
}

// The underlay must look like a NIC: no segmentation or checksum offload
// on the wire, GRO (and so NAPI) on receive, NAPI threaded on the IRQ core.
func TestUnderlayBehavesLikeNIC(t *testing.T) {
	tb := upForTest(t, Config{IRQCPU: 0})
	for _, h := range tb.Hosts {
		for _, f := range []ethtool.Feature{ethtool.TSO, ethtool.GSO, ethtool.TxChecksum} {
			on, err := ethtool.Get(h.NetNS, h.Underlay, f)
			if err != nil {
				t.Fatal(err)
			}
			if on {
				t.Errorf("%s/%s: %s is on", h.NetNS, h.Underlay, f.Name)
			}
		}
		if on, _ := ethtool.Get(h.NetNS, h.Underlay, ethtool.GRO); !on {
			t.Errorf("%s/%s: GRO is off", h.NetNS, h.Underlay)
		}
		threads, err := NAPIThreads(h.NetNS, h.Underlay)
		if err != nil {
			t.Fatal(err)
		}
		if len(threads) == 0 {
			t.Fatalf("%s/%s: no threaded NAPI", h.NetNS, h.Underlay)
		}
		for _, th := range threads {
			aff, err := th.Affinity()
			if err != nil {
				t.Fatal(err)
			}
			if len(aff) != 1 || aff[0] != 0 {
				t.Errorf("%s affinity %v, want [0]", th.Comm, aff)
			}
		}
	}
	// MTU-sized frames on the wire: a 4 MB TCP transfer arrives as
	// frames no larger than the underlay MTU (+ Ethernet header).
	r := tb.Receiver()
	before := rxCounters(t, r.NetNS, r.Underlay)
	tcpTransfer(t, tb.Sender().Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 4<<20)
	after := rxCounters(t, r.NetNS, r.Underlay)
	pkts, bytes := after[1]-before[1], after[0]-before[0]
	if pkts == 0 || bytes/pkts > uint64(tb.Config.MTU+14) {
		t.Fatalf("underlay received %d bytes in %d frames: frames larger than the MTU crossed the wire", bytes, pkts)
	}
}

func rxCounters(t *testing.T, ns, dev string) [2]uint64 {
	t.Helper()
	out, err := nsx.Output(ns, "cat", "/proc/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(name) == dev {
			var c [2]uint64
			fmt.Sscan(rest, &c[0], &c[1])
			return c
		}
	}
	t.Fatalf("%s not in /proc/net/dev of %s", dev, ns)
	return [2]uint64{}
}

// With SenderApart the sending host's NIC is polled on another core than
// the IRQ core, the receiving host's still on the IRQ core.
func TestSenderApart(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 cores")
	}
	tb := upForTest(t, Config{IRQCPU: 1, SenderApart: true})
	for i, want := range []int{0, 1} {
		h := tb.Hosts[i]
		if got := tb.Config.PollCPU(i); got != want {
			t.Errorf("PollCPU(%d) = %d, want %d", i, got, want)
		}
		threads, err := NAPIThreads(h.NetNS, h.Underlay)
		if err != nil || len(threads) == 0 {
			t.Fatalf("%s/%s: NAPI threads %v (%v)", h.NetNS, h.Underlay, threads, err)
		}
		for _, th := range threads {
			if aff, err := th.Affinity(); err != nil || len(aff) != 1 || aff[0] != want {
				t.Errorf("%s affinity %v (%v), want [%d]", th.Comm, aff, err, want)
			}
			checkPollerSched(t, th, tb.Config.PollFIFO(i))
		}
	}
	if c := tb.Config; c.PollFIFO(0) != senderPollFIFO || c.PollFIFO(1) != 0 {
		t.Errorf("SenderApart: pollers at FIFO %d (sender) and %d (receiver), want %d and 0", c.PollFIFO(0), c.PollFIFO(1), senderPollFIFO)
	}
	if c := (Config{IRQCPU: 1}); c.PollFIFO(0) != 0 {
		t.Errorf("both on the IRQ core: sender's poller at FIFO %d, want normal scheduling", c.PollFIFO(0))
	}
	if c := (Config{IRQCPU: 0, SenderApart: true}); c.PollCPU(0) != 1 || c.PollCPU(1) != 0 {
		t.Errorf("IRQ core 0: sender polled on %d, receiver on %d; want 1 and 0", c.PollCPU(0), c.PollCPU(1))
	}
}

// checkPollerSched: a NIC poller runs SCHED_FIFO at fifo (PollFIFO), or
// normal scheduling for 0.
func checkPollerSched(t *testing.T, th kthread.Thread, fifo int) {
	t.Helper()
	a, err := unix.SchedGetAttr(th.PID, 0)
	if err != nil {
		t.Fatalf("%s: %v", th.Comm, err)
	}
	want, prio := uint32(unix.SCHED_NORMAL), uint32(0)
	if fifo > 0 {
		want, prio = unix.SCHED_FIFO, uint32(fifo)
	}
	if a.Policy != want || a.Priority != prio {
		t.Errorf("%s: policy %d priority %d, want %d %d", th.Comm, a.Policy, a.Priority, want, prio)
	}
}

func TestUpIsIdempotentAndDownIsComplete(t *testing.T) {
	tb := upForTest(t, Config{Containers: 1})
	threads, _ := NAPIThreads(tb.Receiver().NetNS, tb.Receiver().Underlay)
	again, err := Up(tb.Config)
	if err != nil {
		t.Fatal(err)
	}
	threads2, _ := NAPIThreads(tb.Receiver().NetNS, tb.Receiver().Underlay)
	if len(threads) == 0 || len(threads2) != len(threads) || threads2[0].PID != threads[0].PID {
		t.Fatalf("second up rebuilt an intact testbed (NAPI threads %v -> %v)", threads, threads2)
	}
	if again.Config != tb.Config {
		t.Fatalf("config changed: %+v -> %+v", tb.Config, again.Config)
	}
	// A different config converges: rebuilt with 2 containers.
	cfg := tb.Config
	cfg.Containers = 2
	tb2, err := Up(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb2.Receiver().Containers) != 2 || !nsx.Exists(tb2.Receiver().Containers[1].NetNS) {
		t.Fatal("up with a new config did not rebuild")
	}
	if err := Down(cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	if left := nsx.List(cfg.Prefix + "-"); len(left) > 0 {
		t.Fatalf("namespaces left: %v", left)
	}
	for _, th := range threads2 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", th.PID)); err == nil {
			t.Errorf("NAPI thread %s still exists after down", th.Comm)
		}
	}
	if _, err := Load(cfg.Prefix); err == nil {
		t.Fatal("state file survived down")
	}
	// Down of nothing is fine.
	if err := Down(cfg.Prefix); err != nil {
		t.Fatal(err)
	}
}

func TestDownFromHalfBuiltState(t *testing.T) {
	testenv.Root(t)
	prefix := fmt.Sprintf("lh%d", os.Getpid()%100000)
	t.Cleanup(func() { Down(prefix) })
	// Namespaces exist, no state file, no devices: what a crash mid-up leaves.
	for _, ns := range []string{prefix + "-h1", prefix + "-h2-c1"} {
		if err := nsx.Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := nsx.Create(prefix + "x-h1"); err != nil { // another testbed's: kept
		t.Fatal(err)
	}
	t.Cleanup(func() { nsx.Delete(prefix + "x-h1") })
	if err := Down(prefix); err != nil {
		t.Fatal(err)
	}
	if left := nsx.List(prefix + "-"); len(left) > 0 {
		t.Fatalf("left: %v", left)
	}
	if !nsx.Exists(prefix + "x-h1") {
		t.Fatal("down removed another prefix's namespace")
	}
}

func TestValidate(t *testing.T) {
	bad := []Config{
		{Topology: "weave"},
		{Containers: -1},
		{IRQCPU: 64},
		{MTU: 100},
		{VNI: 1 << 25},
		{Prefix: "waytoolongprefix"},
		{NIC: "polled"},
		{NIC: NICSoftirq, MTU: 9000}, // the wire's XDP takes one page
		{NoForwardRules: true},       // flanneld's, without flanneld
		{Overlay: OverlayDockerd, NoForwardRules: true},
	}
	for _, c := range bad {
		c2 := c
		if c2.Topology == "" {
			c2.Topology = Docker
		}
		c2 = c2.withDefaults()
		if c.Containers == -1 {
			c2.Containers = -1
		}
		if err := c2.Validate(2); err == nil {
			t.Errorf("%+v: no error", c)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("error is not one line: %q", err)
		}
	}
	if err := (Config{}).withDefaults().Validate(2); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	if err := (Config{NIC: NICSoftirq, MTU: 9000}).withDefaults().Validate(2); err == nil || !strings.Contains(err.Error(), "--nic threaded") {
		t.Errorf("softirq NIC at MTU 9000: %v, want a fix-it naming --nic threaded", err)
	}
	if err := (Config{NIC: NICSoftirq, MTU: 3000}).withDefaults().Validate(2); err != nil {
		t.Errorf("softirq NIC at MTU 3000: %v", err)
	}
	_ = kthread.Thread{}
}

// TestStopStrays: a process a killed run left inside the testbed is found
// and stopped; one in another prefix's namespace is not touched.
func TestStopStrays(t *testing.T) {
	testenv.Root(t)
	prefix := fmt.Sprintf("ls%d", os.Getpid()%100000)
	t.Cleanup(func() { Down(prefix) })
	ours, theirs := prefix+"-h2-c1", prefix+"x-h1"
	for _, ns := range []string{ours, theirs} {
		if err := nsx.Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { nsx.Delete(theirs) })
	start := func(ns string) *exec.Cmd {
		cmd := exec.Command("sleep", "600")
		if err := nsx.Do(ns, cmd.Start); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	stray, other := start(ours), start(theirs)
	got := Strays(prefix)
	if len(got) != 1 || got[0].PID != stray.Process.Pid || got[0].NetNS != ours || got[0].Comm != "sleep" {
		t.Fatalf("strays: %v, want sleep (pid %d) in %s alone", got, stray.Process.Pid, ours)
	}
	if st := StopStrays(prefix); len(st) != 1 {
		t.Fatalf("stopped %v", st)
	}
	if err := stray.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the stray: %v, want killed", err)
	}
	if left := Strays(prefix); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("another prefix's process: %v", err)
	}
}

// With the NIC polled in softirq, each host's underlay device has no
// poller thread, and its polls run in NET_RX softirq on its IRQ core,
// raised there by the wire's pinned thread (wire.c): seen in the kernel's
// napi:napi_poll events, recorded in a tracing instance of the test's own
// so the host's tracing is untouched. The sender's NIC is polled apart
// (SenderApart), so every poll's core tells which host's IRQ core it is.
func TestSoftirqNIC(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 cores: the sender's NIC apart from the receiver's")
	}
	tb := upForTest(t, Config{NIC: NICSoftirq, IRQCPU: 1, SenderApart: true})
	if !nsx.Exists(tb.Config.WireNS()) {
		t.Fatalf("no wire namespace %s", tb.Config.WireNS())
	}
	for i, h := range tb.Hosts {
		if on, _ := ethtool.Get(h.NetNS, h.Underlay, ethtool.GRO); !on {
			t.Errorf("%s/%s: GRO (NAPI) is off", h.NetNS, h.Underlay)
		}
		if th, err := NAPIThreads(h.NetNS, h.Underlay); err != nil || len(th) != 0 {
			t.Errorf("%s/%s: NAPI threads %v (%v), want none: its polls must run in softirq", h.NetNS, h.Underlay, th, err)
		}
		// The wire end that delivers to host i runs on its IRQ core.
		th, err := NAPIThreads(tb.Config.WireNS(), wireEnd(2-i))
		if err != nil || len(th) != 1 {
			t.Fatalf("wire end %s: NAPI threads %v (%v), want one", wireEnd(2-i), th, err)
		}
		if aff, _ := th[0].Affinity(); len(aff) != 1 || aff[0] != tb.Config.PollCPU(i) {
			t.Errorf("%s: affinity %v, want [%d] (%s's IRQ core)", th[0].Comm, aff, tb.Config.PollCPU(i), h.Name)
		}
		checkPollerSched(t, th[0], tb.Config.PollFIFO(i))
	}
	polls := traceNAPIPolls(t, func() {
		s, r := tb.Sender(), tb.Receiver()
		tcpTransfer(t, s.Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 4<<20)
		udpTransfer(t, r.Containers[1].NetNS, s.Containers[1].NetNS, s.Containers[1].Addr.Addr(), 1000)
		tcpTransfer(t, s.NetNS, r.NetNS, r.UnderlayAddr.Addr(), 1<<20)
	})
	for i, h := range tb.Hosts {
		want := fmt.Sprintf("cpu%d softirq", tb.Config.PollCPU(i))
		got := polls[h.Underlay]
		if len(got) == 0 {
			t.Errorf("%s: no poll traced", h.Underlay)
		}
		for where, n := range got {
			if where != want {
				t.Errorf("%s: %d polls on %s, want all on %s", h.Underlay, n, where, want)
			}
		}
		t.Logf("%s polls: %v", h.Underlay, got)
	}
	c, err := tb.WireCounts()
	if err != nil {
		t.Fatal(err)
	}
	if c.Forwarded < 1000 || c.NoPeer != 0 {
		t.Errorf("wire counts %+v: want thousands forwarded and none without a peer", c)
	}
}

// traceNAPIPolls runs fn while a tracing instance of its own records
// napi:napi_poll, and counts the polls of every device by where they ran:
// "cpuN softirq" or "cpuN thread".
func traceNAPIPolls(t *testing.T, fn func()) map[string]map[string]int {
	t.Helper()
	root := "/sys/kernel/tracing"
	if _, err := os.Stat(filepath.Join(root, "instances")); err != nil {
		// Not mounted (a fresh machine): mount it for the test, and
		// take it away again afterwards (cleanups run last-in first-out,
		// so after the instance's removal).
		if err := unix.Mount("nodev", root, "tracefs", 0, ""); err != nil {
			t.Skipf("no tracefs at %s, and mounting it failed: %v", root, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(root, 0); err != nil {
				// Busy (an instance left behind): detach it all the same.
				if derr := unix.Unmount(root, unix.MNT_DETACH); derr != nil {
					t.Errorf("unmounting tracefs at %s: %v, detaching: %v", root, err, derr)
				}
			}
		})
	}
	inst := filepath.Join(root, "instances", fmt.Sprintf("lanes-test-%d", os.Getpid()))
	if err := os.Mkdir(inst, 0o755); err != nil {
		t.Fatalf("making a tracing instance: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(inst); err != nil {
			t.Errorf("removing tracing instance %s: %v", inst, err)
		}
	})
	enable := filepath.Join(inst, "events/napi/napi_poll/enable")
	if _, err := os.Stat(enable); err != nil {
		t.Skipf("no napi:napi_poll event in this kernel: %v", err)
	}
	if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
		t.Fatalf("enabling napi:napi_poll: %v", err)
	}
	fn()
	if err := os.WriteFile(enable, []byte("0"), 0); err != nil {
		t.Fatalf("disabling napi:napi_poll: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(inst, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	// "  napi/w1-531-25068   [001] ..s1.   571.632715: napi_poll: napi poll on napi struct 00000000ecb0986e for device ul2 work 1 budget 64"
	line := regexp.MustCompile(`\[(\d+)\]\s+(\S+)\s+[\d.]+: napi_poll: .* for device (\S+) work`)
	out := map[string]map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		cpu, _ := strconv.Atoi(m[1])
		ctx := "thread"
		// The flags' third column is 's' in softirq context (both
		// softirq and hardirq: 'H').
		if len(m[2]) >= 3 && (m[2][2] == 's' || m[2][2] == 'H') {
			ctx = "softirq"
		}
		if out[m[3]] == nil {
			out[m[3]] = map[string]int{}
		}
		out[m[3]][fmt.Sprintf("cpu%d %s", cpu, ctx)]++
	}
	return out
}
