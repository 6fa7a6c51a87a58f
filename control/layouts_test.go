package control_test

import (
	"fmt"
	"testing"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
)

// The BPF modes mount bpffs: the tests run in a mount namespace of their own.
func TestMain(m *testing.M) { modetest.Main(m, "tc") }

// reorders are the modes that may give up order (MFLOW, whose micro-flows
// are merged in order only where the kernel has the BPF qdisc,
// docs/reorder.md); their streams are checked for arrival only.
var reorders = map[string]bool{"mflow": true}

// variants are settings an operator is told about in the README that
// change which mechanisms a mode sets up, applied besides each mode's
// defaults.
var variants = []struct {
	mode   string
	params map[string]string
}{
	{"falcon", map[string]string{"spread": "always"}},
	{"falcon", map[string]string{"split": "rps"}},
	{"prism-batch", map[string]string{"veth-queues": "class"}},
	{"mflow", map[string]string{"at": "bridge"}},
}

// TestEveryModeOnEveryLayout applies every registered mode, with its
// defaults and the variants above, to the receiver of each testbed layout
// (Docker's L2 overlay, Flannel's routed VXLAN with a pod bridge, Calico's
// routed VXLAN with a routed veth per pod), and of Docker's with the
// underlay NIC polled in softirq instead of by a pinned thread, the modes
// told its IRQ core (plan.IRQKey), and checks what an operator
// needs of any mode on any host: it applies, a sequence-numbered UDP
// stream crosses the overlay complete and in order (marked high priority
// where the mode has classes, so both classes' paths carry traffic), TCP
// and the reverse direction and a second container work, and reset puts
// every knob back byte for byte, after which the overlay still works.
func TestEveryModeOnEveryLayout(t *testing.T) {
	type run struct {
		mode   string
		params map[string]string
	}
	var runs []run
	for _, m := range plan.Modes() {
		runs = append(runs, run{mode: m})
	}
	for _, v := range variants {
		runs = append(runs, run{v.mode, v.params})
	}
	type layout struct {
		topo    testbed.Topology
		nic     string
		overlay string
	}
	var layouts []layout
	for _, topo := range testbed.Topologies {
		layouts = append(layouts, layout{topo: topo, nic: testbed.NICThreaded})
	}
	// A NIC polled in softirq, as most physical NICs are, whose IRQ core
	// the modes are told (a veth has no interrupt to read it from).
	layouts = append(layouts, layout{topo: testbed.Docker, nic: testbed.NICSoftirq})
	// The overlays the real daemons build: what operators run.
	for _, o := range testbed.Overlays {
		layouts = append(layouts, layout{overlay: o})
	}
	for _, lay := range layouts {
		name := string(lay.topo)
		if lay.nic != testbed.NICThreaded && lay.overlay == "" {
			name += "-" + lay.nic + "-nic"
		}
		if lay.overlay != "" {
			name = lay.overlay
		}
		t.Run(name, func(t *testing.T) {
			var tb *testbed.Testbed
			if lay.overlay != "" {
				tb = modetest.UpTestbedOverlay(t, lay.overlay)
			} else {
				tb = modetest.UpTestbedNIC(t, lay.topo, lay.nic)
			}
			r, s := tb.Receiver(), tb.Sender()
			rc, sc := r.Containers[0], s.Containers[0]
			rc2, sc2 := r.Containers[1], s.Containers[1]
			dst, dst2 := rc.Addr.Addr(), rc2.Addr.Addr()
			for _, ru := range runs {
				name := ru.mode
				for k, v := range ru.params {
					name += fmt.Sprintf(":%s=%s", k, v)
				}
				params := ru.params
				if cpu, ok := tb.GivenIRQCPU(); ok {
					params = plan.WithIRQ(ru.mode, params, cpu)
				}
				t.Run(name, func(t *testing.T) {
					before := modetest.Snapshot(t, tb)
					a := modetest.Apply(t, tb, ru.mode, params)
					if set, err := control.OpenPrio(r.NetNS); err == nil {
						// Container 1 high priority, container 2 bulk.
						err := set.Add(modetest.Rule(t, "dst "+dst.String()))
						set.Close()
						if err != nil {
							t.Fatal(err)
						}
					}
					overlaytest.Stream{Count: 3000, Size: 64, Burst: 100, Pause: 1e6, CPU: 0}.Delivered(t, "stream to container 1", !reorders[ru.mode], sc.NetNS, rc.NetNS, dst)
					overlaytest.TCP(t, sc.NetNS, rc.NetNS, dst, 2<<20)
					overlaytest.UDPMost(t, rc.NetNS, sc.NetNS, sc.Addr.Addr(), 200)
					overlaytest.UDPMost(t, sc2.NetNS, rc2.NetNS, dst2, 1000)
					if a.State.Plan.Changes == 0 { // vanilla: nothing to restore
						a.Reset(t)
						modetest.SameSnapshot(t, "after reset of "+ru.mode, modetest.Snapshot(t, tb), before)
					} else {
						a.ResetAndCheck(t, before)
					}
					overlaytest.UDPMost(t, sc.NetNS, rc.NetNS, dst, 200)
				})
			}
		})
	}
}
