//go:build linux

package steer

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// steer_flows is sized for the host, and a flow whose state the LRU
// evicted comes back in another count epoch: frames of the evicted state
// still in flight carry its epoch, and must not count out of the new one
// (a random epoch reused the old one one time in eight).
func TestEvictedFlowNewEpoch(t *testing.T) {
	// One core for every BPF_PROG_RUN: an LRU hash keeps each CPU's new
	// entries on that CPU's pending list until the CPU next allocates, so
	// an old flow made on a core the thread then left is never evicted.
	defer pinThread(t, 0)()
	d, _ := newDatapath(t)
	n, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	capacity := d.objs.SteerFlows.MaxEntries()
	if capacity != FlowEntries(n) || capacity < 16384 {
		t.Fatalf("steer_flows holds %d entries, want FlowEntries(%d) = %d", capacity, n, FlowEntries(n))
	}
	epochOf := func(f flowSpec) (uint32, bool) {
		var st steerSteerFlowState
		k := flowKeyOf(refTuple(f), StageSplit)
		if err := d.objs.SteerFlows.Lookup(k, &st); err != nil {
			return 0, false
		}
		return st.Epoch, true
	}
	const flows = 32
	old := map[uint16]uint32{}
	for i := range flows {
		f := udpFlow(uint16(1000 + i))
		runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
		e, ok := epochOf(f)
		if !ok {
			t.Fatalf("no state for flow %d", i)
		}
		old[f.sport] = e
	}
	// Enough other flows to evict every one of them.
	floodFlows(t, d)
	same := 0
	for i := range flows {
		f := udpFlow(uint16(1000 + i))
		if _, ok := epochOf(f); ok {
			t.Fatalf("flow %d survived %d newer flows in an LRU of %d", i, capacity+capacity/2, capacity)
		}
		runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
		e, ok := epochOf(f)
		if !ok {
			t.Fatalf("no state for flow %d made anew", i)
		}
		if e == old[f.sport] {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d of %d flows made anew after eviction took their evicted state's epoch", same, flows)
	}
}

// floodFlows runs one frame of each of half again as many new flows as
// steer_flows holds through steer_xdp: enough to evict every older state
// made on the calling thread's core (pin it: an LRU hash keeps each CPU's
// new entries on that CPU's pending list). It returns how many.
func floodFlows(t *testing.T, d *Datapath) int {
	t.Helper()
	n := int(d.objs.SteerFlows.MaxEntries()) * 3 / 2
	for i := range n {
		f := udpFlow(uint16(i))
		f.dst = netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
	}
	return n
}
