package testbed

//go:generate go tool bpf2go -tags linux -target bpfel wire wire.c -- -I../datapath/bpf/include -I/usr/include/x86_64-linux-gnu

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/lanesnet/lanes/internal/nsx"
)

// How a host's underlay "NIC" is polled (Config.NIC).
const (
	// NICThreaded polls the receiving underlay veth with threaded NAPI,
	// its kthread pinned to the IRQ core. The kernel runs the softirqs
	// a poll raised (the VXLAN GRO cell, the container veth's backlog)
	// as soon as the thread re-enables bottom halves after each poll, so
	// every poll's frames reach their sockets before the next poll: the
	// receive path is streamlined already. The testbed's default.
	NICThreaded = "threaded"
	// NICSoftirq polls it in NET_RX softirq on the IRQ core, as the
	// drivers of most physical NICs do: the NIC's poll shares the
	// softirq poll list with the later stages it feeds, in first-come
	// order (the interleaved polling of PRISM's paper). Each underlay
	// veth then ends in a wire namespace whose pinned thread hands the
	// frames on (wire.c).
	NICSoftirq = "softirq"
	// NICVeth leaves the underlay a plain veth pair, as two hosts'
	// namespaces joined by one are: its NAPI is not threaded, and veth
	// schedules a peer's NAPI on the core that transmitted, so each
	// host's receive path starts on its sender's core. lanes cannot read
	// an IRQ core there (there is none): the case its defaults must not
	// make worse than vanilla.
	NICVeth = "veth"
)

// wireMaxMTU is the largest underlay MTU the wire carries: veth refuses
// an XDP program without multi-buffer support when the peer's MTU exceeds
// a page less XDP headroom and skb_shared_info (about 3.5 KB on 4 KB
// pages), and the wire's program handles single buffers only.
const wireMaxMTU = 3500

// NICModes lists the values Config.NIC takes.
var NICModes = []string{NICThreaded, NICSoftirq, NICVeth}

// WireNS is the namespace of the wire between the hosts' underlay veths
// (NIC softirq only).
func (c Config) WireNS() string { return c.Prefix + "-wire" }

// wireEnd is the wire's end facing host h (1-based): it receives what h
// sends, and its thread runs on the other host's IRQ core.
func wireEnd(h int) string { return fmt.Sprintf("w%d", h) }

// buildWire connects each host's underlay device to its end of the wire:
// a veth pair per host, one queue each way (one IRQ per NIC).
func (tb *Testbed) buildWire() error {
	wns := tb.Config.WireNS()
	hw, closeW, err := handle(wns)
	if err != nil {
		return err
	}
	defer closeW()
	for i, h := range tb.Hosts {
		hfd, err := nsFd(h.NetNS)
		if err != nil {
			return err
		}
		err = hw.LinkAdd(nicVeth(wireEnd(i+1), mac(roleWire, byte(i+1), 0), h.Underlay, h.UnderlayMAC, tb.Config.MTU, hfd))
		hfd.Close()
		if err != nil {
			return fmt.Errorf("adding wire veth %s<->%s: %w", wireEnd(i+1), h.Underlay, err)
		}
	}
	for i := range tb.Hosts {
		l, err := hw.LinkByName(wireEnd(i + 1))
		if err == nil {
			err = hw.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("bringing up %s: %w", wireEnd(i+1), err)
		}
	}
	return nil
}

// attachWire loads wire.c, points each wire end at the other and attaches
// the program to both (native XDP, which also turns on their NAPI). It
// runs once both hosts' underlay devices are up with GRO on, so the wire
// ends are XDP redirect targets.
func (tb *Testbed) attachWire() error {
	wns := tb.Config.WireNS()
	var objs wireObjects
	if err := loadWireObjects(&objs, nil); err != nil {
		return fmt.Errorf("loading the wire program: %w", err)
	}
	// The kernel keeps the program and its maps while it is attached.
	defer objs.Close()
	hw, closeW, err := handle(wns)
	if err != nil {
		return err
	}
	defer closeW()
	var ends [2]netlink.Link
	for i := range ends {
		if ends[i], err = hw.LinkByName(wireEnd(i + 1)); err != nil {
			return err
		}
	}
	// A devmap entry names its device by ifindex in the namespace of the
	// thread that writes it.
	err = nsx.Do(wns, func() error {
		for i, e := range ends {
			if err := objs.Peers.Put(uint32(e.Attrs().Index), uint32(ends[1-i].Attrs().Index)); err != nil {
				return fmt.Errorf("pointing %s at %s: %w", e.Attrs().Name, ends[1-i].Attrs().Name, err)
			}
		}
		// The netlink package's own handle speaks to this thread's
		// namespace.
		for _, e := range ends {
			if err := netlink.LinkSetXdpFdWithFlags(e, objs.Wire.FD(), nl.XDP_FLAGS_DRV_MODE); err != nil {
				return fmt.Errorf("attaching the wire program to %s: %w", e.Attrs().Name, err)
			}
		}
		return nil
	})
	return err
}

// WireCounts are the frames the wire carried.
type WireCounts struct {
	Forwarded uint64 // handed to the other end
	NoPeer    uint64 // dropped: the other end was not (yet) known
}

// WireCounts reads the wire program's counters (NIC softirq only).
func (tb *Testbed) WireCounts() (WireCounts, error) {
	if tb.Config.NIC != NICSoftirq {
		return WireCounts{}, fmt.Errorf("this testbed has no wire: its NIC is %s (bring it up with --nic %s)", tb.Config.NIC, NICSoftirq)
	}
	hw, closeW, err := handle(tb.Config.WireNS())
	if err != nil {
		return WireCounts{}, err
	}
	defer closeW()
	l, err := hw.LinkByName(wireEnd(1))
	if err != nil {
		return WireCounts{}, err
	}
	if l.Attrs().Xdp == nil || l.Attrs().Xdp.ProgId == 0 {
		return WireCounts{}, fmt.Errorf("%s has no wire program: the testbed is broken, bring it down and up again", wireEnd(1))
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(l.Attrs().Xdp.ProgId))
	if err != nil {
		return WireCounts{}, fmt.Errorf("opening the wire program: %w", err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return WireCounts{}, err
	}
	ids, _ := info.MapIDs()
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err != nil || mi.Name != "counts" {
			m.Close()
			continue
		}
		var c WireCounts
		for i, dst := range []*uint64{&c.Forwarded, &c.NoPeer} {
			var per []uint64
			if err := m.Lookup(uint32(i), &per); err != nil {
				m.Close()
				return WireCounts{}, fmt.Errorf("reading the wire's counts: %w", err)
			}
			for _, v := range per {
				*dst += v
			}
		}
		m.Close()
		return c, nil
	}
	return WireCounts{}, errors.New("the wire program has no counts map")
}

// GivenIRQCPU is the receiving NIC's IRQ core when the modes cannot read
// it and must be told it (plan.IRQKey), as an operator would on a host
// whose NIC is virtual: with the NIC polled in softirq (a veth has no
// interrupt to read it from). False otherwise: the modes read it (a
// pinned NAPI thread), or there is none (NICVeth).
func (tb *Testbed) GivenIRQCPU() (int, bool) {
	if tb.Config.NIC != NICSoftirq {
		return 0, false
	}
	return tb.Config.PollCPU(1), true
}
