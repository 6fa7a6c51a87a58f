package topotest

import (
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/topology"
)

// Receiver is a receiving host as discovery reports the testbed's, built
// without touching the kernel, for planners' unit tests: namespace h2 with
// the underlay ul2 (its NAPI thread pinned to core 1), vxlan0 (VNI 42,
// port 4789) and the host-side veth1 of one container, h2-c1 (eth0).
func Receiver() *topology.Topology {
	rx := []topology.RxQueue{{Index: 0}}
	return &topology.Topology{
		NetNS: "h2",
		Kind:  topology.Docker,
		VXLANs: []topology.VXLAN{{
			Device: topology.Device{Name: "vxlan0", NetNS: "h2", RxQueues: rx},
			VNI:    42, Port: 4789, Underlay: "ul2", UnderlayNetNS: "h2",
		}},
		Underlays: []topology.Device{{Name: "ul2", NetNS: "h2", RxQueues: rx,
			NAPIThreads: []kthread.Info{{PID: 10, Comm: "napi/ul2-8193", CPUs: []int{1}}}}},
		Veths: []topology.Veth{{Device: topology.Device{Name: "veth1", NetNS: "h2"}, PeerNetNS: "h2-c1", PeerName: "eth0"}},
		Containers: []topology.Container{{NetNS: "h2-c1", Interfaces: []topology.Interface{{
			Device: topology.Device{Name: "eth0", NetNS: "h2-c1", RxQueues: rx}, HostVeth: "veth1"}}}},
	}
}
