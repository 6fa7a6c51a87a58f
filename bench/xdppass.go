package bench

import (
	"fmt"
	"net"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/internal/nsx"
)

// The testbed's underlay is a veth. A veth hands vanilla the sender's own
// skb (shared pages, nothing copied), but before an XDP program may run it
// copies every frame it cannot hand over as is (cloned, paged or short of
// headroom: every TCP segment) into a buffer of its own, as a NIC's DMA
// would have filled one. So every mode that attaches XDP to the underlay
// (prism, falcon's split, mflow) pays a copy on the receive core that
// vanilla does not and that a real NIC does in hardware: a noticeable
// share of that core under bulk TCP (profiled). The bench setting
// vanilla:xdp-pass=true measures vanilla with a program that only passes
// every frame attached there, so the copy is paid alike: the testbed's
// NIC-like reference for the XDP modes.

// xdpPassOn says whether mode asks for xdp-pass (Validate checked it).
func xdpPassOn(mode string) bool {
	_, params, _ := ParseModeSpec(mode)
	on, _ := strconv.ParseBool(params["xdp-pass"])
	return on
}

// attachXDPPass attaches a program that returns XDP_PASS to dev in netns,
// in driver mode (the modes' own path; generic XDP would run after GRO),
// through a BPF link that only this process holds: the detach it returns
// closes the link, and so does the process's end, so a killed bench leaves
// no program behind.
func attachXDPPass(netns, dev string) (detach func() error, err error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "xdp_pass", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("loading the pass-through XDP program: %w", err)
	}
	defer prog.Close() // the link holds its own reference
	var l link.Link
	err = nsx.Do(netns, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attaching the pass-through XDP program to %s: %w", dev, err)
	}
	return l.Close, nil
}
