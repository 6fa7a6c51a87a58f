package prism

import (
	"strings"
	"testing"

	"github.com/lanesnet/lanes/topology"
)

// TestVethPairs: veth-queues=class finds each container veth's host side
// and refuses, with a line saying what to do, veths that cannot take a
// queue per class.
func TestVethPairs(t *testing.T) {
	ok := func() *topology.Topology {
		tp := dockerTopo()
		for i := range tp.Veths {
			tp.Veths[i].MaxTxQueues, tp.Veths[i].MaxRxQueues = 2, 2
		}
		for i := range tp.Containers {
			d := &tp.Containers[i].Interfaces[0].Device
			d.MaxTxQueues, d.MaxRxQueues, d.RxQueues = 2, 2, []topology.RxQueue{{Index: 0}}
		}
		return tp
	}
	pairs, err := vethPairs(ok())
	if err != nil || len(pairs) != 2 || pairs[0].host.Name != "veth1" || pairs[1].ctr.NetNS != "c2" {
		t.Fatalf("pairs %+v (%v), want c1/eth0-veth1 and c2/eth0-veth2", pairs, err)
	}
	for msg, break_ := range map[string]func(*topology.Topology){
		"can use 1 receive queue(s)":  func(tp *topology.Topology) { tp.Containers[0].Interfaces[0].MaxRxQueues = 1 },
		"can use 0 transmit queue(s)": func(tp *topology.Topology) { tp.Veths[1].MaxTxQueues = 0 },
		"has an XPS map":              func(tp *topology.Topology) { tp.Veths[0].XPS = true },
		"runs STP":                    func(tp *topology.Topology) { tp.Bridges[0].STP = true },
		"tcx:cilium_to_container on its egress": func(tp *topology.Topology) {
			tp.Veths[0].Hooks = &topology.Hooks{Egress: []string{"tcx:cilium_to_container"}}
		},
		"xdp:foo on its receive side": func(tp *topology.Topology) {
			tp.Containers[1].Interfaces[0].Hooks = &topology.Hooks{XDP: "foo"}
		},
		"was not found":           func(tp *topology.Topology) { tp.Veths = tp.Veths[:1] },
		"no container veth found": func(tp *topology.Topology) { tp.Containers = nil },
		"per-class queues need exactly two": func(tp *topology.Topology) {
			tp.Containers[0].Interfaces[0].RxQueues = []topology.RxQueue{{Index: 0}, {Index: 1}, {Index: 2}}
		},
	} {
		tp := ok()
		break_(tp)
		if _, err := vethPairs(tp); err == nil || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "veth-queues") {
			t.Errorf("%s: error %v", msg, err)
		}
	}
}
