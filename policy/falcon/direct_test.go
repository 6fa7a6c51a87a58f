//go:build linux

package falcon_test

import (
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/testbed"
)

// A flow staying at the bridge stage skips the VXLAN device's RPS once its
// queued frames are out (datapath/steer/bpf/place.h's stay_direct), on the real kernel: with
// that device's RPS map aimed at the other core only, frames that still
// went through RPS would run the bridge and container stages there; run
// on, they stay on the core of the NIC poll, as in vanilla. The stream
// arrives complete and in order across the switch from queued to direct.
// With x-stay=queued (the comparison setting) every frame takes RPS.
func TestBridgeStayRunsOn(t *testing.T) {
	cpus := online(t)
	if len(cpus) < 2 {
		t.Skip("needs two cores")
	}
	type run struct {
		topo   testbed.Topology
		queued bool
	}
	var runs []run
	for _, topo := range testbed.Topologies {
		runs = append(runs, run{topo, false})
	}
	runs = append(runs, run{testbed.Docker, true})
	for _, rn := range runs {
		topo := rn.topo
		name := string(topo)
		params := map[string]string{}
		if rn.queued {
			name += "/x-stay=queued"
			params["x-stay"] = falcon.StayQueued
		}
		t.Run(name, func(t *testing.T) {
			tb := upTestbed(t, topo)
			r, s := tb.Receiver(), tb.Sender()
			before := modetest.Snapshot(t, tb)
			// Pipelining alone: no agent to change the tables under the test.
			a := apply(t, tb, "falcon-pipeline", params)
			dp := a.Open(t)
			defer dp.Close()
			// The receiver's NIC poll runs on the testbed's IRQ core.
			// RPS on the VXLAN device is aimed at the other core only;
			// the apply recorded the knob, so the reset below restores it.
			irq := tb.Config.PollCPU(1)
			other := cpus[0]
			if other == irq {
				other = cpus[1]
			}
			// Both later stages stay. The container stage runs where
			// the bridge stage ran, and the misaimed RPS map makes that
			// the other core for the first, queued frames and the IRQ
			// core after: the container stage holds the other core
			// until its frames queued there were seen (datapath/steer/bpf/order.h's
			// stay_core), then follows. Before it held its core, this
			// reordered (seen once: 1 datagram of 3000 out of order).
			var stay [steer.Buckets]uint32
			for b := range stay {
				stay[b] = steer.Stay
			}
			for _, st := range []int{steer.StageBridge, steer.StageContainer} {
				if err := dp.Placement().SetTable(st, stay); err != nil {
					t.Fatal(err)
				}
			}
			rps := knobs.Sysfs(r.NetNS, "/sys/class/net/"+r.VXLAN+"/queues/rx-0/rps_cpus")
			if err := rps.Write([]byte(cpuset.FormatMask([]int{other}))); err != nil {
				t.Fatal(err)
			}
			st0, err := dp.CoreStats()
			if err != nil {
				t.Fatal(err)
			}
			res := overlaytest.Stream{Count: 3000, Size: 64, Burst: 50, Pause: 200 * time.Microsecond, CPU: other}.
				Delivered(t, string(topo)+" stream", true, s.Containers[0].NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr())
			st1, err := dp.CoreStats()
			if err != nil {
				t.Fatal(err)
			}
			// The container stage's program runs where the bridge stage
			// ran (the host-side veth's egress).
			var onIRQ, onOther, direct, held uint64
			for c := range st1 {
				d := st1[c][steer.StageContainer].Sub(st0[c][steer.StageContainer])
				held += d.Held
				n := d.Stayed + d.Steered
				switch c {
				case irq:
					onIRQ += n
				case other:
					onOther += n
				}
				direct += st1[c][steer.StageBridge].Direct - st0[c][steer.StageBridge].Direct
			}
			t.Logf("bridge stage ran %d frames on the IRQ core %d, %d on core %d (the RPS map's); %d ran on; the container stage held its core for %d; last datagram received on core %d",
				onIRQ, irq, onOther, other, direct, held, res.IncomingCPU)
			if rn.queued {
				if direct != 0 || onIRQ != 0 {
					t.Errorf("x-stay=queued: %d frames ran on, %d ran on the IRQ core; want every one through RPS", direct, onIRQ)
				}
				dp.Close()
				a.ResetAndCheck(t, before)
				return
			}
			if direct == 0 {
				t.Error("no frame ran on")
			}
			// The first frames of the flow queue (to the other core) until
			// they are seen; the rest run on. Most must be on the IRQ core.
			if onIRQ < onOther*4 || res.IncomingCPU != irq {
				t.Errorf("frames ran on the IRQ core %d times, on RPS's core %d times, the last was received on core %d: RPS was not skipped",
					onIRQ, onOther, res.IncomingCPU)
			}
			dp.Close()
			a.ResetAndCheck(t, before)
		})
	}
}
