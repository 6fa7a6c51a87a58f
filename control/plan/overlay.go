package plan

import (
	"fmt"
	"slices"

	"github.com/lanesnet/lanes/topology"
)

// Helpers the planners of BPF-based modes share.

// IRQCPUs are the cores the underlay's NAPI threads are pinned to, when
// every one is pinned to a single core; nil when unknown.
func IRQCPUs(t *topology.Topology) []int {
	var out []int
	for _, u := range t.Underlays {
		if len(u.NAPIThreads) == 0 {
			return nil
		}
		for _, th := range u.NAPIThreads {
			if len(th.CPUs) != 1 {
				return nil
			}
			if !slices.Contains(out, th.CPUs[0]) {
				out = append(out, th.CPUs[0])
			}
		}
	}
	slices.Sort(out)
	return out
}

// VXLANIDs are the UDP port and VNIs of t's VXLAN devices, for programs
// that must recognise their frames; devices on another port are noted in
// pl and left out.
func VXLANIDs(t *topology.Topology, pl *Plan) (uint16, []uint32, error) {
	var port uint16
	var vnis []uint32
	for _, v := range t.VXLANs {
		p := uint16(v.Port)
		if p == 0 {
			p = 4789
		}
		if port == 0 {
			port = p
		} else if p != port {
			pl.Notes = append(pl.Notes, fmt.Sprintf("vxlan %s uses port %d, not %d: its frames pass unsteered", v.Name, p, port))
			continue
		}
		if !slices.Contains(vnis, uint32(v.VNI)) {
			vnis = append(vnis, uint32(v.VNI))
		}
	}
	if port == 0 {
		return 0, nil, fmt.Errorf("no VXLAN device to steer")
	}
	return port, vnis, nil
}

// LinkPin names a link's pin by kind, namespace and device, so every
// attachment of a target has its own.
func LinkPin(dir, kind, ns, dev string) string {
	return dir + "/link_" + kind + "_" + Target(ns) + "_" + dev
}

// DevLabel names a device for people, as DeviceTarget does.
func DevLabel(ns, dev string) string { return Target(ns) + "/" + dev }
