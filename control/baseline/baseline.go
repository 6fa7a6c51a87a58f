// Package baseline holds the modes lanes is measured against: vanilla (the
// overlay as the kernel runs it) and rps (the kernel's own receive packet
// steering on every overlay receive device).
package baseline

import (
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
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
// by hash; on two cores it lands receive work on the sender's or
// application's core, which costs more than it gains (see
// shared/FACTS.md). It can be a mode of its own.
type rps struct{}

func (rps) Mode() string { return "rps" }
func (rps) Summary() string {
	return "kernel RPS on the VXLAN device and the host- and container-side veths"
}

func (rps) Plan(t *topology.Topology, cfg plan.Config) (*plan.Plan, error) {
	p := &plan.Plan{Mode: "rps"}
	mask := knobs.FormatCPUMask(cfg.CPUs)
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
	return p, nil
}
