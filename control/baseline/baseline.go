// Package baseline holds the modes lanes is measured against: vanilla (the
// overlay as the kernel runs it) and rps (the kernel's own receive packet
// steering on every overlay receive device).
package baseline

import (
	"fmt"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/topology"
)

func init() {
	plan.Register(vanilla{})
	plan.Register(rps{})
}

// vanilla changes nothing: applying it restores whatever lanes changed.
type vanilla struct{}

func (vanilla) Mode() string    { return "vanilla" }
func (vanilla) Summary() string { return "the overlay as the kernel runs it (undo every lanes change)" }
func (vanilla) Plan(*topology.Topology, plan.Config) (*plan.Plan, error) {
	return &plan.Plan{Mode: "vanilla"}, nil
}

// rps sets the RPS map of every rx queue on the overlay's receive devices:
// the VXLAN device (after decapsulation), the host-side veths (traffic from
// containers) and, inside each container, the container-side veths (traffic
// to containers). A packet is then hashed to one of the chosen cores at each
// device it enters, instead of staying on the core that received it from
// the underlay.
//
// RFS (rps_sock_flow_entries, rps_flow_cnt) is not part of it:
// rps_sock_flow_entries exists only in the initial namespace and applies to
// the whole machine, and RFS steers a flow to the core its application runs
// on, which is placement by application, a different policy than spreading
// by hash; on two cores it lands receive work on the core the sender or
// the application keeps busy. It can be a mode of its own.
type rps struct{}

func (rps) Mode() string { return "rps" }
func (rps) Summary() string {
	return "kernel RPS on the VXLAN device and the host- and container-side veths"
}

func (rps) Plan(t *topology.Topology, cfg plan.Config) (*plan.Plan, error) {
	p := &plan.Plan{Mode: "rps"}
	mask := cpuset.FormatMask(cfg.CPUs)
	add := func(d *topology.Device, why string) {
		for _, q := range d.RxQueues {
			p.Add(knobs.Sysfs(d.NetNS, d.QueuePath(q.Index)+"/rps_cpus"), mask, plan.DeviceTarget(d, q.Index), why)
		}
	}
	for i := range t.VXLANs {
		add(&t.VXLANs[i].Device, "spread decapsulated packets")
	}
	for i := range t.Veths {
		add(&t.Veths[i].Device, "spread packets from containers")
	}
	for i := range t.Containers {
		for j := range t.Containers[i].Interfaces {
			ifc := &t.Containers[i].Interfaces[j]
			if ifc.HostVeth != "" {
				add(&ifc.Device, "spread packets into the container")
			}
		}
	}
	if len(p.Changes) == 0 {
		p.Notes = append(p.Notes, "no overlay receive queues found: nothing to steer")
	}
	defaultMask(p, t.NetNS, mask)
	return p, nil
}

// defaultMask sets net.core.rps_default_mask in the target's namespace to
// the plan's mask: the kernel gives it to every device created there from
// then on (per namespace, at creation; a device moved to another namespace
// keeps its own), so a container's host-side veth made in the target
// namespace starts with the plan's RPS map instead of none, or instead of
// a default someone else set (tuned profiles set one), until lanes agent
// adopts it. Set whether or not containers run now, so that the plan does
// not change as they come and go. A kernel without the knob (before 6.3),
// or without it in that namespace, gets a note and the plan without it.
func defaultMask(p *plan.Plan, ns, mask string) {
	k := knobs.Sysctl(ns, "net.core.rps_default_mask")
	if _, err := k.Read(); err != nil {
		p.Notes = append(p.Notes, fmt.Sprintf("net.core.rps_default_mask cannot be read in netns %s (%v): devices created there later get no RPS map until lanes agent adopts them", nsLabel(ns), err))
		return
	}
	p.Add(k, mask, nsLabel(ns)+" net.core.rps_default_mask", "devices created here from now on start with the plan's RPS map")
}

func nsLabel(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}
