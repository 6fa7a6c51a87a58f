package falcon_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/bench/metrics"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
)

func TestMain(m *testing.M) { modetest.Main(m, "tf") }

// Shorthands for the harness, which the tests call often.
type applied = modetest.Applied

func upTestbed(t *testing.T, topo testbed.Topology) *testbed.Testbed {
	return modetest.UpTestbed(t, topo)
}

func apply(t *testing.T, tb *testbed.Testbed, mode string, params map[string]string) *applied {
	return modetest.Apply(t, tb, mode, params)
}

func online(t *testing.T) []int { return modetest.Online(t) }

func tables(t *testing.T, dp *steer.Datapath) [steer.NumStages][steer.Buckets]uint32 {
	t.Helper()
	var out [steer.NumStages][steer.Buckets]uint32
	for s := range out {
		tab, err := dp.Placement().Table(s)
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
	cpus, err := cpuset.ParseMask(string(b))
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
	overlaytest.UDPMost(t, srcNS, dstNS, dst, size)
}

// hogEveryCore runs a busy loop pinned to each online core until the
// returned function is called (also at cleanup).
func hogEveryCore(t *testing.T) func() {
	t.Helper()
	return hogCores(t, online(t))
}

// hogCores runs a busy loop (normal scheduling) pinned to each of cores
// until the returned function is called (also at cleanup).
func hogCores(t *testing.T, cores []int) func() {
	t.Helper()
	var stops []func()
	for _, c := range cores {
		stops = append(stops, modetest.Hog(t, c))
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// drained checks, once the traffic has stopped, that every (flow, stage)
// the datapath counted frames into its queue for was counted out again:
// the split stage's count relies on XDP metadata reaching tc ingress on
// the split core, which only real frames show.
func drained(t *testing.T, dp *steer.Datapath) {
	t.Helper()
	var flows []steer.Flow
	// A stage at home (the agent's fallback) skips per-flow work, so
	// counts its frames left in flight never drain, and need not: it
	// moves nothing, and leaving home clears the stage's flow states.
	var home [steer.NumStages]bool
	for range 50 {
		var err error
		if flows, err = dp.Flows(); err != nil {
			t.Fatal(err)
		}
		if home, err = dp.Placement().Home(); err != nil {
			t.Fatal(err)
		}
		busy := false
		for _, f := range flows {
			busy = busy || (f.InFlight != 0 && !home[f.Stage])
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
		if f.InFlight != 0 && !home[f.Stage] {
			t.Errorf("%s stage of %v:%d -> %v:%d: %d frames still counted in flight after the traffic stopped",
				steer.StageName(f.Stage), f.Src, f.SrcPort, f.Dst, f.DstPort, f.InFlight)
		}
	}
	if split == 0 {
		t.Error("no split-stage flow state: the drain count was not exercised")
	}
}

// softnet reads the "processed" column of /proc/net/softnet_stat per core.
func softnet(t *testing.T) map[int]uint64 {
	t.Helper()
	sn, err := metrics.ReadSoftnet()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint64{}
	for c, s := range sn {
		out[c] = s.Processed
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
func flowAt(t *testing.T, dp *steer.Datapath, r overlaytest.StreamResult, stage int) (steer.Flow, bool) {
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

// packetCounter counts, per core, the packets a device receives: a tcx
// ingress program runs in __netif_receive_skb_core, on the core that
// processes the device's receive, and adds one to a per-CPU counter.
type packetCounter struct {
	m *ebpf.Map
}

// countPackets attaches a packetCounter to dev in ns until the test ends.
func countPackets(t *testing.T, ns, dev string) *packetCounter {
	t.Helper()
	m := modetest.PerCPUCounter(t)
	insns := append(modetest.IncCounter(m, "out"),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("out"), // TCX_NEXT
		asm.Return(),
	)
	modetest.AttachTCX(t, ns, dev, "count_rx", insns, ebpf.AttachTCXIngress, nil)
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

// needsSplit skips a test that checks the split stage (XDP + cpumap): the
// planners switch splitting off on kernels whose cpumap has no GRO (before
// 6.15), as documented, so there is nothing of it to check there.
func needsSplit(t *testing.T) {
	t.Helper()
	if ok, why := steer.KernelSupport(); !ok {
		t.Skip("splitting is off on this kernel: " + why)
	}
}
