//go:build linux

package steer

import (
	"bytes"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/internal/testenv"
)

const (
	xdpPass     = 2
	xdpRedirect = 4
	tcUnspec    = ^uint32(0) // TC_ACT_UNSPEC (-1) as BPF_PROG_RUN returns it

	// loIfindex is the device BPF_PROG_RUN runs on: the loopback device of
	// the test's namespace.
	loIfindex = 1
)

// xdpMd is the kernel's struct xdp_md, the XDP test run's context.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// testCores is the core set the tests configure: the first two cores, or
// one on a single-core machine (cpumap entries need cores that exist).
func testCores(t *testing.T) []int {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	if n >= 2 {
		return []int{0, 1}
	}
	return []int{0}
}

// newDatapath loads a fresh datapath with an enabled config over
// testCores, a cpumap entry per core, every table bucket set to Stay.
func newDatapath(t *testing.T) (*Datapath, []int) {
	t.Helper()
	testenv.Root(t)
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	cores := testCores(t)
	if err := d.SetConfig(Config{Enabled: true, CPUs: cores, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cores {
		if err := d.CPUMap().Set(c, 64); err != nil {
			t.Fatal(err)
		}
	}
	for s := range NumStages {
		setAll(t, d, s, Stay)
	}
	return d, cores
}

func setAll(t *testing.T, d *Datapath, stage int, idx uint32) {
	t.Helper()
	var tab [Buckets]uint32
	for b := range tab {
		tab[b] = idx
	}
	if err := d.Placement().SetTable(stage, tab); err != nil {
		t.Fatal(err)
	}
}

// tcpSegment is a VXLAN frame of TCP flow f with payload, so that it ends
// a GRO segment only with PSH (a pure ACK always does).
func tcpSegment(f flowSpec, psh bool) []byte {
	b := vxlanFrame(frameSpec{flow: f, payload: 100})
	const tcpFlags = 50 + 14 + 20 + 13 // outer headers, inner Ethernet and IPv4
	b[tcpFlags] = 0x10
	if psh {
		b[tcpFlags] = 0x18
	}
	return b
}

// runXDP runs steer_xdp on frame as received by lo and returns the verdict
// and the frame as the program left it, without its metadata.
func runXDP(t *testing.T, d *Datapath, frame []byte) (uint32, []byte) {
	t.Helper()
	ret, out, _ := runXDPMeta(t, d, frame)
	return ret, out
}

// runXDPMeta is runXDP that also returns the XDP metadata the program put
// in front of the frame (nil if none).
func runXDPMeta(t *testing.T, d *Datapath, frame []byte) (uint32, []byte, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	var ctxOut xdpMd
	opts := ebpf.RunOptions{
		Data:       frame,
		DataOut:    out,
		Context:    xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: loIfindex},
		ContextOut: &ctxOut,
	}
	ret, err := d.XDP().Run(&opts)
	if err != nil {
		t.Fatalf("running steer_xdp on %d bytes: %v", len(frame), err)
	}
	// The test run copies out from data_meta; the context's data is the
	// metadata's length.
	m := int(ctxOut.Data - ctxOut.DataMeta)
	if m < 0 || m > len(opts.DataOut) {
		t.Fatalf("context out %+v does not fit %d bytes out", ctxOut, len(opts.DataOut))
	}
	var meta []byte
	if m > 0 {
		meta = opts.DataOut[:m]
	}
	return ret, opts.DataOut[m:], meta
}

// runTC runs a tc program on frame as an skb on lo.
func runTC(t *testing.T, p *ebpf.Program, frame []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := p.Run(&opts)
	if err != nil {
		t.Fatalf("running %s on %d bytes: %v", p, len(frame), err)
	}
	return ret, opts.DataOut
}

func stats(t *testing.T, d *Datapath) [NumStages]Counters {
	t.Helper()
	s, err := d.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// flowState returns the flow's steer_flows entry at a stage.
func flowState(t *testing.T, d *Datapath, f flowSpec, stage int) (Flow, bool) {
	t.Helper()
	flows, err := d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	for _, fl := range flows {
		if fl.Stage == stage && fl.Src == f.src && fl.Dst == f.dst &&
			fl.SrcPort == f.sport && fl.DstPort == f.dport && fl.Proto == f.proto {
			return fl, true
		}
	}
	return Flow{}, false
}

func mustFlow(t *testing.T, d *Datapath, f flowSpec, stage int) Flow {
	t.Helper()
	fl, ok := flowState(t, d, f, stage)
	if !ok {
		t.Fatalf("no %s entry for flow %+v", StageName(stage), f)
	}
	return fl
}

func sameBytes(t *testing.T, name string, in, out []byte) {
	t.Helper()
	if !bytes.Equal(in, out) {
		t.Errorf("%s: output frame differs from input\n in: %x\nout: %x", name, in, out)
	}
}

// stampFlows sets every flow state's last packet time to at and returns
// how many there were: a stamp a core wrote after a reader took its clock.
func stampFlows(t *testing.T, d *Datapath, at time.Duration) int {
	t.Helper()
	var (
		k  steerSteerFlowKey
		st steerSteerFlowState
		n  int
	)
	it := d.objs.SteerFlows.Iterate()
	for it.Next(&k, &st) {
		st.LastNs = uint64(at)
		if err := d.objs.SteerFlows.Put(&k, &st); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
