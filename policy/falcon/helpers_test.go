package falcon_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
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
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// isolatedEnv marks the re-executed test binary that runs in a mount
// namespace of its own.
const isolatedEnv = "LANES_FALCON_TEST_MOUNTNS"

// TestMain runs the tests in a private mount namespace (as root). The
// falcon plan mounts bpffs at /sys/fs/bpf and its reset unmounts it again,
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
func TestMain(m *testing.M) {
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

func prefixBase() string { return fmt.Sprintf("tf%d", os.Getpid()%10000) }

var tbSeq atomic.Int32

// upTestbed builds a testbed under a prefix of this process and tears it
// down when the test ends, pass or fail, checking nothing is left.
func upTestbed(t *testing.T, topo testbed.Topology) *testbed.Testbed {
	t.Helper()
	topotest.RequireRoot(t)
	prefix := fmt.Sprintf("%s%c", prefixBase(), 'a'+rune(tbSeq.Add(1)-1)%26)
	old := testbed.StateDir
	testbed.StateDir = t.TempDir()
	mounted := bpffsMounted(t)
	t.Cleanup(func() {
		// Runs after the cleanups of everything applied to the testbed.
		if bpffsMounted(t) != mounted {
			t.Errorf("bpffs at %s: mounted %v at the end, %v at the start", plan.BPFFS, !mounted, mounted)
		}
		for _, h := range []string{prefix + "-h1", prefix + "-h2"} {
			if exists(plan.PinDir(h)) {
				t.Errorf("pin directory %s left behind", plan.PinDir(h))
			}
		}
		if err := testbed.Down(prefix); err != nil {
			t.Errorf("testbed down: %v", err)
		}
		if left := nsx.List(prefix + "-"); len(left) > 0 {
			t.Errorf("testbed down left namespaces behind: %v", left)
		}
		testbed.StateDir = old
	})
	tb, err := testbed.Up(testbed.Config{Prefix: prefix, Topology: topo, IRQCPU: 1})
	if err != nil {
		t.Fatalf("testbed up: %v", err)
	}
	return tb
}

// online returns the online cores; the tests need exactly the layout the
// brief assumes: cores 0 and 1, the IRQ core 1.
func online(t *testing.T) []int {
	t.Helper()
	cpus, err := knobs.OnlineCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cpus, 0) || !slices.Contains(cpus, 1) {
		t.Skipf("needs cores 0 and 1 online, have %v", cpus)
	}
	return cpus
}

// bpffsMounted says whether /sys/fs/bpf is a bpf filesystem.
func bpffsMounted(t *testing.T) bool {
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

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// snapshot reads every knob any falcon mode might touch on both hosts of
// the testbed, byte for byte: threaded, rps_cpus and rps_flow_cnt of every
// device in every namespace (containers included), the XDP program and the
// tcx programs (both directions) of every device, whether /sys/fs/bpf is a
// bpffs and whether the receiver's pin directory exists.
func snapshot(t *testing.T, tb *testbed.Testbed) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, h := range tb.Hosts {
		topo, err := topology.Discover(h.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		devs := topo.AllDevices()
		if len(devs) < 3+2*len(h.Containers) {
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
			id, err := attach.Attached(d.NetNS, d.Name)
			if err != nil {
				t.Fatal(err)
			}
			out["xdp:"+d.NetNS+":"+d.Name] = strconv.FormatUint(uint64(id), 10)
			for dir, at := range map[string]ebpf.AttachType{"ingress": ebpf.AttachTCXIngress, "egress": ebpf.AttachTCXEgress} {
				out["tcx:"+d.NetNS+":"+d.Name+":"+dir] = tcxProgs(t, d.NetNS, d.Name, at)
			}
		}
	}
	out["bpffs:"+plan.BPFFS] = strconv.FormatBool(bpffsMounted(t))
	dir := plan.PinDir(tb.Receiver().NetNS)
	out["pindir:"+dir] = strconv.FormatBool(exists(dir))
	return out
}

// tcxProgs lists the ids of the tcx programs on a device, "" for none.
func tcxProgs(t *testing.T, ns, dev string, at ebpf.AttachType) string {
	t.Helper()
	var ids []string
	err := knobs.Do(ns, func() error {
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

func sameSnapshot(t *testing.T, what string, got, want map[string]string) {
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

// noState checks that a state directory holds nothing: no target
// directory, no journal, no state file.
func noState(t *testing.T, stateDir string) {
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

// applied is a falcon mode applied to the receiver of a testbed.
type applied struct {
	tb       *testbed.Testbed
	ns       string // the receiver's namespace
	stateDir string
	pinDir   string
	state    *control.State
	reset    bool
}

// apply applies mode to the receiver and resets it when the test ends
// unless the test reset it itself (resetAndCheck).
func apply(t *testing.T, tb *testbed.Testbed, mode string, params map[string]string) *applied {
	t.Helper()
	a := &applied{tb: tb, ns: tb.Receiver().NetNS, stateDir: t.TempDir()}
	a.pinDir = plan.PinDir(a.ns)
	st, err := control.Apply(control.Options{Mode: mode, NetNS: a.ns, StateDir: a.stateDir, Params: params})
	// Registered before checking err: a failed apply must leave nothing,
	// and a reset of nothing is harmless.
	t.Cleanup(func() {
		if a.reset {
			return
		}
		if _, err := control.Reset(a.ns, a.stateDir); err != nil {
			t.Errorf("cleanup reset of %s: %v", mode, err)
		}
		if exists(a.pinDir) {
			t.Errorf("cleanup: pin directory %s left behind", a.pinDir)
		}
		noState(t, a.stateDir)
	})
	if err != nil {
		t.Fatalf("apply %s: %v", mode, err)
	}
	if st.Phase != control.Applied || st.Mode != mode {
		t.Fatalf("apply %s: state %+v", mode, st)
	}
	a.state = st
	return a
}

// resetAndCheck resets the mode and checks that everything is as in
// before: every knob, no XDP, no pin directory, bpffs as before, no state.
func (a *applied) resetAndCheck(t *testing.T, before map[string]string) {
	t.Helper()
	res, err := control.Reset(a.ns, a.stateDir)
	a.reset = true
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	if res.Nothing || res.Mode != a.state.Mode {
		t.Errorf("reset result %+v: want %s restored", res, a.state.Mode)
	}
	if res.Report != nil && len(res.Report.Restored) != a.state.Plan.Changes {
		t.Errorf("reset restored %d knobs, the apply made %d changes", len(res.Report.Restored), a.state.Plan.Changes)
	}
	sameSnapshot(t, "after reset of "+a.state.Mode, snapshot(t, a.tb), before)
	if id, err := attach.Attached(a.ns, a.tb.Receiver().Underlay); err != nil || id != 0 {
		t.Errorf("after reset: XDP program %d on %s (%v)", id, a.tb.Receiver().Underlay, err)
	}
	if exists(a.pinDir) {
		t.Errorf("after reset: pin directory %s still exists", a.pinDir)
	}
	noState(t, a.stateDir)
}

// open opens the applied datapath; closed when the test ends (before the
// reset of the cleanup).
func (a *applied) open(t *testing.T) *steer.Datapath {
	t.Helper()
	dp, err := steer.Open(a.pinDir)
	if err != nil {
		t.Fatalf("opening the pinned datapath: %v", err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp
}

func tables(t *testing.T, dp *steer.Datapath) [steer.NumStages][steer.Buckets]uint32 {
	t.Helper()
	var out [steer.NumStages][steer.Buckets]uint32
	for s := range out {
		tab, err := dp.Table(s)
		if err != nil {
			t.Fatal(err)
		}
		out[s] = tab
	}
	return out
}

func fill(v uint32) [steer.Buckets]uint32 {
	var tab [steer.Buckets]uint32
	for b := range tab {
		tab[b] = v
	}
	return tab
}

func allEqual(tab [steer.Buckets]uint32, v uint32) bool { return tab == fill(v) }

// rpsCPUs reads the rx-0 RPS mask of a device.
func rpsCPUs(t *testing.T, ns, dev string) []int {
	t.Helper()
	b, err := knobs.Sysfs(ns, "/sys/class/net/"+dev+"/queues/rx-0/rps_cpus").Read()
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := knobs.ParseCPUMask(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return cpus
}

// pinnedProgID is the id of the program pinned at path.
func pinnedProgID(t *testing.T, path string) uint32 {
	t.Helper()
	p, err := ebpf.LoadPinnedProgram(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("kernel does not report program ids")
	}
	return uint32(id)
}

func tcpTransfer(t *testing.T, srcNS, dstNS string, dst netip.Addr, n int) {
	t.Helper()
	overlaytest.TCP(t, srcNS, dstNS, dst, n)
}

// udpTransfer checks that most datagrams arrive intact.
func udpTransfer(t *testing.T, srcNS, dstNS string, dst netip.Addr, size int) {
	t.Helper()
	if got := overlaytest.UDP(t, srcNS, dstNS, dst, size); got < overlaytest.UDPCount*9/10 {
		t.Fatalf("UDP %s -> %s: %d of %d datagrams arrived", srcNS, dstNS, got, overlaytest.UDPCount)
	}
}

// stream is a sequence-numbered UDP stream from a sender thread pinned to
// one core.
type stream struct {
	Count, Size, Burst int
	Pause              time.Duration
	CPU                int // core of the sending thread
	// During runs while the stream is sent (optional).
	During func()
}

type streamResult struct {
	Sent, SendErrs, Received int
	// Reordered counts arrivals whose sequence number is not above every
	// one that arrived before.
	Reordered int
	Examples  []string
	// IncomingCPU is SO_INCOMING_CPU of the receiving socket at the end:
	// the core that ran UDP receive (the container stage) for the last
	// datagram.
	IncomingCPU int
	Src, Dst    netip.AddrPort
}

const rcvBuf = 8 << 20

// run sends the stream from a socket in srcNS to a socket bound to dst in
// dstNS and accounts the arrivals.
func (s stream) run(t *testing.T, srcNS, dstNS string, dst netip.Addr) streamResult {
	t.Helper()
	if s.Size < 8 {
		s.Size = 8
	}
	if s.Burst == 0 {
		s.Burst = s.Count
	}
	var rc *net.UDPConn
	if err := nsx.Do(dstNS, func() (err error) {
		rc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0)))
		if err != nil {
			return err
		}
		// SO_RCVBUFFORCE: SetReadBuffer is capped at rmem_max.
		raw, err := rc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf)
		}); err != nil {
			return err
		}
		return serr
	}); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var sc *net.UDPConn
	if err := nsx.Do(srcNS, func() (err error) {
		sc, err = net.DialUDP("udp4", nil, rc.LocalAddr().(*net.UDPAddr))
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	res := streamResult{
		Src: sc.LocalAddr().(*net.UDPAddr).AddrPort(),
		Dst: rc.LocalAddr().(*net.UDPAddr).AddrPort(),
	}
	res.Src = netip.AddrPortFrom(res.Src.Addr().Unmap(), res.Src.Port())
	res.Dst = netip.AddrPortFrom(res.Dst.Addr().Unmap(), res.Dst.Port())
	// Connect the receiver to the sender: UDP updates SO_INCOMING_CPU
	// for connected sockets only.
	raw, err := rc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Addr: res.Src.Addr().As4(), Port: int(res.Src.Port())})
	}); err != nil || cerr != nil {
		t.Fatalf("connecting the receiver to %v: %v %v", res.Src, err, cerr)
	}

	var sendDone atomic.Bool
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf := make([]byte, 65536)
		var highest uint64
		first := true
		for {
			rc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := rc.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && !sendDone.Load() {
					continue
				}
				return
			}
			if n < 8 {
				continue
			}
			seq := binary.BigEndian.Uint64(buf)
			res.Received++
			if !first && seq <= highest {
				res.Reordered++
				if len(res.Examples) < 5 {
					res.Examples = append(res.Examples, fmt.Sprintf("%d after %d", seq, highest))
				}
			} else {
				highest = seq
			}
			first = false
		}
	}()

	sendErr := make(chan error, 1)
	go func() {
		// Pinning changes this thread for good: never unlock, so the
		// runtime retires it with the goroutine.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(s.CPU)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			sendErr <- fmt.Errorf("pinning the sender to core %d: %w", s.CPU, err)
			return
		}
		msg := make([]byte, s.Size)
		for i := 0; i < s.Count; i++ {
			binary.BigEndian.PutUint64(msg, uint64(i))
			if _, err := sc.Write(msg); err != nil {
				res.SendErrs++
			}
			res.Sent++
			if (i+1)%s.Burst == 0 && s.Pause > 0 {
				time.Sleep(s.Pause)
			}
		}
		sendErr <- nil
	}()
	if s.During != nil {
		s.During()
	}
	err = <-sendErr
	sendDone.Store(true)
	<-recvDone
	if err != nil {
		t.Fatal(err)
	}
	var gerr error
	raw.Control(func(fd uintptr) {
		res.IncomingCPU, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_INCOMING_CPU)
	})
	if gerr != nil {
		t.Fatalf("SO_INCOMING_CPU: %v", gerr)
	}
	return res
}

// hogEveryCore runs a busy loop pinned to each online core until the
// returned function is called (also at cleanup).
func hogEveryCore(t *testing.T) func() {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, c := range online(t) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Never unlocked: the runtime retires the pinned thread.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(c)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return
			}
			for !stop.Load() {
			}
		}()
	}
	var once sync.Once
	done := func() { once.Do(func() { stop.Store(true); wg.Wait() }) }
	t.Cleanup(done)
	return done
}

// drained checks, once the traffic has stopped, that every (flow, stage)
// the datapath counted frames into its queue for was counted out again:
// the split stage's count relies on XDP metadata reaching tc ingress on
// the split core, which only real frames show.
func drained(t *testing.T, dp *steer.Datapath) {
	t.Helper()
	var flows []steer.Flow
	for range 50 {
		var err error
		if flows, err = dp.Flows(); err != nil {
			t.Fatal(err)
		}
		busy := false
		for _, f := range flows {
			busy = busy || f.InFlight != 0
		}
		if !busy {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	split := 0
	for _, f := range flows {
		if f.Stage == steer.StageSplit && f.Packets > 0 {
			split++
		}
		if f.InFlight != 0 {
			t.Errorf("%s stage of %v:%d -> %v:%d: %d frames still counted in flight after the traffic stopped",
				steer.StageName(f.Stage), f.Src, f.SrcPort, f.Dst, f.DstPort, f.InFlight)
		}
	}
	if split == 0 {
		t.Error("no split-stage flow state: the drain count was not exercised")
	}
}

// inOrder sends a stream once and fails the test if any datagram arrived
// out of order or too few arrived.
func inOrder(t *testing.T, what string, r streamResult) {
	t.Helper()
	t.Logf("%s: sent %d (%d send errors), received %d, reordered %d %v", what, r.Sent, r.SendErrs, r.Received, r.Reordered, r.Examples)
	if r.Received*10 < r.Sent*9 {
		t.Errorf("%s: only %d of %d datagrams arrived", what, r.Received, r.Sent)
	}
	if r.Reordered != 0 {
		t.Errorf("%s: %d datagrams arrived out of order", what, r.Reordered)
	}
}

// softnet reads the "processed" column of /proc/net/softnet_stat per core.
func softnet(t *testing.T) map[int]uint64 {
	t.Helper()
	f, err := os.Open("/proc/net/softnet_stat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cpus, err := knobs.OnlineCPUs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint64{}
	sc := bufio.NewScanner(f)
	for row := 0; sc.Scan(); row++ {
		cols := strings.Fields(sc.Text())
		processed, err := strconv.ParseUint(cols[0], 16, 32)
		if err != nil {
			t.Fatal(err)
		}
		cpu := -1
		if len(cols) >= 13 { // since 5.x the 13th column is the core
			c, err := strconv.ParseUint(cols[12], 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			cpu = int(c)
		} else if row < len(cpus) {
			cpu = cpus[row]
		}
		out[cpu] = processed
	}
	return out
}

// softnetDelta is after - before per core, with 32-bit wrap-around.
func softnetDelta(before, after map[int]uint64) map[int]uint64 {
	out := map[int]uint64{}
	for c, a := range after {
		out[c] = uint64(uint32(a - before[c]))
	}
	return out
}

// flowAt returns the steer_flows entry of the stream's flow at a stage.
func flowAt(t *testing.T, dp *steer.Datapath, r streamResult, stage int) (steer.Flow, bool) {
	t.Helper()
	flows, err := dp.Flows()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Stage == stage && f.Proto == unix.IPPROTO_UDP && f.Src == r.Src.Addr() && f.Dst == r.Dst.Addr() &&
			f.SrcPort == r.Src.Port() && f.DstPort == r.Dst.Port() {
			return f, true
		}
	}
	return steer.Flow{}, false
}

// oneLine checks an error is there, on one line, and says want.
func oneLine(t *testing.T, what string, err error, want string) {
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

// packetCounter counts, per core, the packets a device receives: a tcx
// ingress program runs in __netif_receive_skb_core, on the core that
// processes the device's receive, and adds one to a per-CPU counter.
type packetCounter struct {
	m *ebpf.Map
}

// countPackets attaches a packetCounter to dev in ns until the test ends.
func countPackets(t *testing.T, ns, dev string) *packetCounter {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "count_rx",
		Type: ebpf.SchedCLS,
		Instructions: asm.Instructions{
			asm.StoreImm(asm.R10, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.R10),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.Add.Imm(asm.R1, 1),
			asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, -1).WithSymbol("out"), // TCX_NEXT
			asm.Return(),
		},
		License: "MIT",
	})
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
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifi.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		t.Fatalf("attaching a packet counter to %s in %s: %v", dev, ns, err)
	}
	t.Cleanup(func() { l.Close() })
	return &packetCounter{m: m}
}

// read returns the count per core (index = core number).
func (c *packetCounter) read(t *testing.T) []uint64 {
	t.Helper()
	var per []uint64
	if err := c.m.Lookup(uint32(0), &per); err != nil {
		t.Fatal(err)
	}
	return per
}
