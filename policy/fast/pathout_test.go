package fast_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/fast"
	"github.com/lanesnet/lanes/topology"
)

// outTopology is the docker layout's host: a VXLAN device and a
// container's veth on a bridge, the underlay eth0.
func outTopology() *topology.Topology {
	return &topology.Topology{
		VXLANs: []topology.VXLAN{{Device: topology.Device{Name: "vxlan0", Index: 5, Up: true, MTU: 1450}, VNI: 42, Master: "br0",
			Underlay: "eth0", SrcPorts: [2]int{32768, 60999}}},
		Underlays: []topology.Device{{Name: "eth0", Index: 2, Up: true, MTU: 1500}},
		Bridges: []topology.Bridge{{Device: topology.Device{Name: "br0", Index: 4, Up: true, MTU: 1450}, Ports: []string{"vxlan0", "veth1"},
			PortInfo: []topology.BridgePort{{Name: "vxlan0", State: "forwarding"}, {Name: "veth1", State: "forwarding"}}}},
		Veths:      []topology.Veth{{Device: topology.Device{Name: "veth1", Index: 7, Up: true, MTU: 1450}, Master: "br0", PeerNetNS: "c1"}},
		Containers: []topology.Container{{NetNS: "c1", Interfaces: []topology.Interface{{Device: topology.Device{Name: "eth0", Up: true, MTU: 1450, MAC: "02:00:00:00:00:07"}, HostVeth: "veth1"}}}},
	}
}

// The way out runs from the containers' veths through the VXLAN devices
// to their underlays, with each device's source port range and the MTU
// the smaller of the device's and the underlay's less the outer headers;
// anything on what it skips, or what it cannot know, keeps it off there,
// with a note saying why.
func TestPathOut(t *testing.T) {
	want := steer.FastOutPath{VXLANs: []steer.FastOutVXLAN{{VNI: 42, PortMin: 32768, PortMax: 60999, MTU: 1450}}, Veths: []uint32{7}, Underlays: []uint32{2}}
	p := fast.PathOf(outTopology(), map[string]topology.Filters{"": {}})
	if !slices.Equal(p.Out.VXLANs, want.VXLANs) || !slices.Equal(p.Out.Veths, want.Veths) || !slices.Equal(p.Out.Underlays, want.Underlays) || !slices.Equal(p.OutVeths, []string{"veth1"}) {
		t.Fatalf("path out %+v (%v), want %+v; notes %q", p.Out, p.OutVeths, want, p.Notes)
	}
	for _, c := range []struct {
		name   string
		change func(*topology.Topology)
		note   string
		veths  bool // the VXLAN device stays; only the veth is off
	}{
		{"a program on the underlay's egress", func(t *topology.Topology) {
			t.Underlays[0].Hooks = &topology.Hooks{Egress: []string{"tcx:shaper"}}
		}, "underlay eth0 has transmit programs or filters (tcx:shaper)", false},
		{"a program on the VXLAN device", func(t *topology.Topology) {
			t.VXLANs[0].Hooks = &topology.Hooks{Egress: []string{"clsact:bpf"}}
		}, "it has programs or filters (clsact:bpf)", false},
		{"the port range unread", func(t *topology.Topology) { t.VXLANs[0].SrcPorts = [2]int{} }, "source port range", false},
		{"the underlay in another namespace", func(t *topology.Topology) { t.VXLANs[0].UnderlayNetNS = "other" }, "bpf_redirect cannot send", false},
		{"an external device", func(t *topology.Topology) { t.VXLANs[0].External = true }, "external", false},
		{"a program on the veth's ingress", func(t *topology.Topology) {
			t.Veths[0].Hooks = &topology.Hooks{Ingress: []string{"tcx:policy"}}
		}, "its ingress has tcx:policy", true},
		{"the veth's port blocking", func(t *topology.Topology) { t.Bridges[0].PortInfo[1].State = "blocking" }, "not forwarding freely", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			top := outTopology()
			c.change(top)
			p := fast.PathOf(top, map[string]topology.Filters{"": {}})
			if len(p.Out.Veths) != 0 || (len(p.Out.VXLANs) != 0) == !c.veths {
				t.Errorf("path out %+v: want it off", p.Out)
			}
			if !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.Contains(n, "fast path out off") && strings.Contains(n, c.note) }) {
				t.Errorf("notes %q: want one saying %q", p.Notes, c.note)
			}
		})
	}
	p = fast.PathOf(outTopology(), map[string]topology.Filters{"": {XFRM: []string{"policy"}}})
	if len(p.Out.Veths) != 0 || len(p.Out.VXLANs) != 0 {
		t.Errorf("with an IPsec policy: path out %+v, want none", p.Out)
	}
}
