package testbed

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// DeviceStatus is one device of a host as the kernel reports it now.
type DeviceStatus struct {
	NetNS string   `json:"netns"`
	Name  string   `json:"name"`
	Kind  string   `json:"kind"`
	Up    bool     `json:"up"`
	MTU   int      `json:"mtu"`
	Addrs []string `json:"addrs,omitempty"`
	// NAPI lists the device's NAPI kthreads and the cores they may run on.
	NAPI []NAPIStatus `json:"napi,omitempty"`
}

// NAPIStatus is one NAPI kthread.
type NAPIStatus struct {
	Thread   string `json:"thread"`
	PID      int    `json:"pid"`
	Affinity []int  `json:"affinity"`
	LastCPU  int    `json:"last_cpu"`
}

// Status lists the devices of every namespace of the testbed.
func (tb *Testbed) Status() ([]DeviceStatus, error) {
	var out []DeviceStatus
	add := func(ns string, names ...string) error {
		nh, closeH, err := handle(ns)
		if err != nil {
			return err
		}
		defer closeH()
		for _, n := range names {
			l, err := nh.LinkByName(n)
			if err != nil {
				return fmt.Errorf("%s in %s: %w", n, ns, err)
			}
			ds := DeviceStatus{NetNS: ns, Name: n, Kind: l.Type(), Up: l.Attrs().OperState == 6 || l.Attrs().Flags&1 != 0, MTU: l.Attrs().MTU}
			addrs, _ := nh.AddrList(l, 2) // AF_INET
			for _, a := range addrs {
				ds.Addrs = append(ds.Addrs, a.IPNet.String())
			}
			threads, _ := NAPIThreads(ns, n)
			for _, t := range threads {
				aff, _ := t.Affinity()
				last, _ := t.LastCPU()
				ds.NAPI = append(ds.NAPI, NAPIStatus{Thread: t.Comm, PID: t.PID, Affinity: aff, LastCPU: last})
			}
			out = append(out, ds)
		}
		return nil
	}
	if tb.Config.NIC == NICSoftirq {
		if err := add(tb.Config.WireNS(), wireEnd(1), wireEnd(2)); err != nil {
			return nil, err
		}
	}
	for _, h := range tb.Hosts {
		names := []string{h.VXLAN}
		if h.Bridge != "" { // calico has none
			names = append(names, h.Bridge)
		}
		for _, c := range h.Containers {
			names = append(names, c.HostVeth)
		}
		if err := add(h.NetNS, h.Underlay); err != nil {
			return nil, err
		}
		if err := add(h.OverlayNS(), names...); err != nil {
			return nil, err
		}
		for _, c := range h.Containers {
			if err := add(c.NetNS, c.Veth); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// WriteStatus renders Status as a table.
func (tb *Testbed) WriteStatus(w io.Writer) error {
	st, err := tb.Status()
	if err != nil {
		return err
	}
	c := tb.Config
	built := "lanes"
	if c.Overlay != "" {
		built = c.Overlay
	}
	r := tb.Receiver()
	fmt.Fprintf(w, "testbed %q: topology %s built by %s, %d containers per host, IRQ core %d (sender's NIC polled on %d), underlay MTU %d, VNI %d, UDP port %d\n",
		c.Prefix, c.Topology, built, c.Containers, c.IRQCPU, c.PollCPU(0), c.MTU, r.VNI, r.Port)
	fmt.Fprintf(w, "%-14s %-15s %-7s %-4s %-5s %-22s %s\n", "NETNS", "DEVICE", "KIND", "UP", "MTU", "ADDRESS", "NAPI (thread -> cores, last ran on)")
	for _, d := range st {
		var napi []string
		for _, n := range d.NAPI {
			napi = append(napi, fmt.Sprintf("%s -> %v, last %d", n.Thread, n.Affinity, n.LastCPU))
		}
		up := "no"
		if d.Up {
			up = "yes"
		}
		fmt.Fprintf(w, "%-14s %-15s %-7s %-4s %-5d %-22s %s\n", shortNS(d.NetNS), d.Name, d.Kind, up, d.MTU, strings.Join(d.Addrs, ","), strings.Join(napi, "; "))
	}
	return nil
}

// shortNS shortens a runtime's namespace path for the table: its file
// name (dockerd's are unique).
func shortNS(ns string) string {
	if strings.HasPrefix(ns, "/") {
		return filepath.Base(ns)
	}
	return ns
}
