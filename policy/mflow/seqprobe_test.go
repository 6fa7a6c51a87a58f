package mflow_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/internal/nsx"
)

// seqProbe counts, at tc ingress of a device, the TCP segments with a
// payload that start before the end of one already seen there (the
// test's stream is the only TCP traffic through it): what reaches that
// point out of order, retransmissions included. TestReassemblyTCP puts
// one past the reassembler, on the container's veth, to tell whether a
// reorder TCP counts was already there or came later (backlog, socket).
type seqProbe struct{ state *ebpf.Map } // {max end, regressions, seen, last core, regressions on another core, segments, first sequence number, the last regression's sequence number and the end it came behind, the skb->priority (a micro-flow tag) of the segment that set the max end, the last regression's and the one it came behind, regressions behind a segment of the same tag}

// seqState is a seqProbe's map.
func seqState(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: seqValue, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

const seqValue = 56

func newSeqProbe(t *testing.T, ns, dev string, at ebpf.AttachType) *seqProbe {
	t.Helper()
	m := seqState(t)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, 76, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R6, 80, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 54), // Ethernet, IPv4 without options, TCP
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R5, 0x0008, "pass"), // ETH_P_IP, network order
		asm.LoadMem(asm.R5, asm.R2, 14, asm.Byte),
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 23, asm.Byte),
		asm.JNE.Imm(asm.R5, 6, "pass"), // TCP
		asm.LoadMem(asm.R7, asm.R2, 16, asm.Half),
		asm.HostTo(asm.BE, asm.R7, asm.Half), // tot_len
		asm.LoadMem(asm.R8, asm.R2, 38, asm.Word),
		asm.HostTo(asm.BE, asm.R8, asm.Word), // seq
		asm.LoadMem(asm.R5, asm.R2, 46, asm.Byte),
		asm.RSh.Imm(asm.R5, 4),
		asm.LSh.Imm(asm.R5, 2), // TCP header length
		asm.Sub.Imm32(asm.R7, 20),
		asm.Sub.Reg32(asm.R7, asm.R5), // payload
		asm.JSLE.Imm32(asm.R7, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R6, 32, asm.Word), // __sk_buff.priority
		asm.StoreMem(asm.R10, -8, asm.R1, asm.Word),
	}
	insns = append(insns, seqCount(m)...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"), // TCX_NEXT
		asm.Return(),
	)
	modetest.AttachTCX(t, ns, dev, "seq_probe", insns, at, nil)
	return &seqProbe{state: m}
}

// reset forgets what the probe saw.
func (p *seqProbe) reset(t *testing.T) {
	t.Helper()
	if err := p.state.Put(uint32(0), make([]byte, seqValue)); err != nil {
		t.Fatal(err)
	}
}

// seqSeen is a seqProbe's map value, read once.
type seqSeen []byte

func (v seqSeen) word(i int) uint32 { return binary.LittleEndian.Uint32(v[4*i : 4*i+4]) }

// regressions is how many segments came in behind one already seen.
func (v seqSeen) regressions() uint32 { return v.word(1) }

// crossed is how many of the regressions came on another core than the
// segment before them: an overtake between two cores' queues.
func (v seqSeen) crossed() uint32 { return v.word(4) }

// segments is how many segments with a payload the probe saw.
func (v seqSeen) segments() uint32 { return v.word(5) }

func (p *seqProbe) read(t *testing.T) seqSeen {
	t.Helper()
	v := make([]byte, seqValue)
	if err := p.state.Lookup(uint32(0), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// says is what the probe saw, for a log line: "R of N <where>", or that
// there was no probe.
func (p *seqProbe) says(t *testing.T, where string) string {
	t.Helper()
	if p == nil {
		return "no probe " + where
	}
	v := p.read(t)
	out := fmt.Sprintf("%d of %d %s", v.regressions(), v.segments(), where)
	if n := v.crossed(); n != 0 {
		out += fmt.Sprintf(" (%d on another core than the segment before)", n)
	}
	if v.regressions() != 0 {
		first, seq, behind := v.word(6), v.word(7), v.word(8)
		cur, ahead := v.word(10), v.word(11)
		if _, _, ok := reorder.Tagged(ahead); ok {
			out += fmt.Sprintf(" (%d behind a segment of their own micro-flow)", v.word(12))
		}
		out += fmt.Sprintf(" (the last at byte %d of the stream, %d bytes behind, %s behind %s)", seq-first, behind-seq, tagName(cur), tagName(ahead))
	}
	return out
}

// newXmitProbe is a seqProbe at the transmit of dev in ns, after its root
// qdisc (the tracepoint net_dev_start_xmit): what the reassembler let out,
// in the order the device got it. With a seqProbe on the container's side
// it tells an overtake inside the qdisc from one after it. A tracepoint
// sees every namespace, so the program compares the device's ifindex and
// its namespace's inode with dev's. encap is the bytes of outer headers
// before the frame the probe reads (VXLAN over IPv4: 50), 0 for none. Nil,
// logged, where the kernel lacks
// what the program needs (BTF, the tracepoint).
func newXmitProbe(t *testing.T, ns, dev string, encap int16) *seqProbe {
	t.Helper()
	k, ok := kernelOf(t, ns, dev, "at "+dev+"'s transmit")
	if !ok {
		return nil
	}
	offData := k.off("sk_buff", "data")
	offPriority := k.off("sk_buff", "priority")
	match := k.match(asm.R7)
	if !k.ok(t) {
		return nil
	}

	m := seqState(t)
	// The frame's first bytes on the stack, up to the end of a TCP header
	// without options, the sequence number 4-aligned.
	l3 := 14 + encap
	size := l3 + 40
	buf := -size
	for (buf+l3+24)%4 != 0 {
		buf--
	}
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord), // skb
		asm.LoadMem(asm.R7, asm.R1, 8, asm.DWord), // dev
	}
	insns = append(insns, match...)
	insns = append(insns,
		asm.LoadMem(asm.R3, asm.R6, offData, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R10),
		asm.Add.Imm(asm.R1, int32(buf)),
		asm.Mov.Imm(asm.R2, int32(size)),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"),
	)
	if encap > 0 {
		insns = append(insns,
			asm.LoadMem(asm.R5, asm.R10, buf+12, asm.Half),
			asm.JNE.Imm(asm.R5, 0x0008, "pass"), // outer IPv4
			asm.LoadMem(asm.R5, asm.R10, buf+23, asm.Byte),
			asm.JNE.Imm(asm.R5, 17, "pass"), // UDP
		)
	}
	insns = append(insns,
		asm.LoadMem(asm.R5, asm.R10, buf+l3-2, asm.Half),
		asm.JNE.Imm(asm.R5, 0x0008, "pass"), // ETH_P_IP, network order
		asm.LoadMem(asm.R5, asm.R10, buf+l3, asm.Byte),
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R10, buf+l3+9, asm.Byte),
		asm.JNE.Imm(asm.R5, 6, "pass"), // TCP
		asm.LoadMem(asm.R7, asm.R10, buf+l3+2, asm.Half),
		asm.HostTo(asm.BE, asm.R7, asm.Half), // tot_len
		asm.LoadMem(asm.R8, asm.R10, buf+l3+24, asm.Word),
		asm.HostTo(asm.BE, asm.R8, asm.Word), // seq
		asm.LoadMem(asm.R5, asm.R10, buf+l3+32, asm.Byte),
		asm.RSh.Imm(asm.R5, 4),
		asm.LSh.Imm(asm.R5, 2), // TCP header length
		asm.Sub.Imm32(asm.R7, 20),
		asm.Sub.Reg32(asm.R7, asm.R5), // payload
		asm.JSLE.Imm32(asm.R7, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R6, offPriority, asm.Word),
		asm.StoreMem(asm.R10, -8, asm.R1, asm.Word),
	)
	insns = append(insns, seqCount(m)...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol("pass"),
		asm.Return(),
	)
	if !k.attach(t, "xmit_probe", "net_dev_start_xmit", insns) {
		return nil
	}
	return &seqProbe{state: m}
}

// probeKernel is what a tracepoint probe needs to read the kernel's
// structures and pick one device's skbs: its BTF and the device's
// ifindex and namespace inode (a tracepoint sees every namespace).
type probeKernel struct {
	spec    *btf.Spec
	what    string
	missing error
	ifindex int
	inum    uint64
}

// kernelOf is dev in ns for a probe; false, logged, without kernel BTF.
func kernelOf(t *testing.T, ns, dev, what string) (*probeKernel, bool) {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Logf("no probe %s: kernel BTF: %v", what, err)
		return nil, false
	}
	k := &probeKernel{spec: spec, what: what}
	if err := nsx.Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err == nil {
			k.ifindex = ifi.Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	k.inum = fi.Sys().(*syscall.Stat_t).Ino
	return k, true
}

// off is the byte offset of a member path of struct typ; a missing one is
// kept for ok.
func (k *probeKernel) off(typ string, path ...string) int16 {
	var s *btf.Struct
	if err := k.spec.TypeByName(typ, &s); err != nil {
		k.missing = fmt.Errorf("%s: %w", typ, err)
		return 0
	}
	o, err := memberOffset(s, path)
	if err != nil {
		k.missing = fmt.Errorf("%s.%v: %w", typ, path, err)
	}
	return int16(o)
}

// ok says whether every offset was found, logging the first that was not.
func (k *probeKernel) ok(t *testing.T) bool {
	t.Helper()
	if k.missing != nil {
		t.Logf("no probe %s: %v", k.what, k.missing)
	}
	return k.missing == nil
}

// attach loads insns as a BTF tracepoint program on tracepoint and attaches
// it until the test ends; false, logged, where the kernel refuses.
func (k *probeKernel) attach(t *testing.T, name, tracepoint string, insns asm.Instructions) bool {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp,
		AttachTo: tracepoint, Instructions: insns, License: "GPL"})
	if err != nil {
		t.Logf("no probe %s: %v", k.what, err)
		return false
	}
	defer prog.Close()
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		t.Logf("no probe %s: %v", k.what, err)
		return false
	}
	t.Cleanup(func() { l.Close() })
	return true
}

// match jumps to "pass" unless the struct net_device in dev is the
// probe's device (clobbers R2).
func (k *probeKernel) match(dev asm.Register) asm.Instructions {
	offIfindex := k.off("net_device", "ifindex")
	offNet := k.off("net_device", "nd_net", "net")
	offInum := k.off("net", "ns", "inum")
	return asm.Instructions{
		asm.LoadMem(asm.R2, dev, offIfindex, asm.Word),
		asm.JNE.Imm(asm.R2, int32(k.ifindex), "pass"),
		asm.LoadMem(asm.R2, dev, offNet, asm.DWord),
		asm.JEq.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.R2, offInum, asm.Word),
		asm.JNE.Imm32(asm.R2, int32(uint32(k.inum)), "pass"), // inodes pass 2^31: compare 32 bits
	}
}

// seqCount is seqProbe's count: R8 a segment's first sequence number, R7
// its payload length, the stack at -8 its skb->priority; it ends by falling
// through to "pass".
func seqCount(m *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.FnGetSmpProcessorId.Call(),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "first"),
		asm.LoadMem(asm.R2, asm.R0, 0, asm.Word),
		asm.Mov.Reg32(asm.R3, asm.R8),
		asm.Sub.Reg32(asm.R3, asm.R2),
		asm.JSGE.Imm32(asm.R3, 0, "advance"),
		asm.LoadMem(asm.R1, asm.R0, 4, asm.Word),
		asm.Add.Imm32(asm.R1, 1),
		asm.StoreMem(asm.R0, 4, asm.R1, asm.Word),
		asm.StoreMem(asm.R0, 28, asm.R8, asm.Word),
		asm.StoreMem(asm.R0, 32, asm.R2, asm.Word),
		asm.LoadMem(asm.R1, asm.R10, -8, asm.Word),
		asm.StoreMem(asm.R0, 40, asm.R1, asm.Word),
		asm.LoadMem(asm.R3, asm.R0, 36, asm.Word),
		asm.StoreMem(asm.R0, 44, asm.R3, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R3, "other"),
		asm.LoadMem(asm.R1, asm.R0, 48, asm.Word),
		asm.Add.Imm32(asm.R1, 1),
		asm.StoreMem(asm.R0, 48, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R0, 12, asm.Word).WithSymbol("other"),
		asm.JEq.Reg(asm.R1, asm.R9, "last"),
		asm.LoadMem(asm.R1, asm.R0, 16, asm.Word),
		asm.Add.Imm32(asm.R1, 1),
		asm.StoreMem(asm.R0, 16, asm.R1, asm.Word),
		asm.Ja.Label("last"),
		asm.StoreImm(asm.R0, 8, 1, asm.Word).WithSymbol("first"),
		asm.StoreMem(asm.R0, 24, asm.R8, asm.Word),
		asm.Add.Reg32(asm.R8, asm.R7).WithSymbol("advance"),
		asm.StoreMem(asm.R0, 0, asm.R8, asm.Word),
		asm.LoadMem(asm.R1, asm.R10, -8, asm.Word),
		asm.StoreMem(asm.R0, 36, asm.R1, asm.Word),
		asm.StoreMem(asm.R0, 12, asm.R9, asm.Word).WithSymbol("last"),
		asm.LoadMem(asm.R1, asm.R0, 20, asm.Word),
		asm.Add.Imm32(asm.R1, 1),
		asm.StoreMem(asm.R0, 20, asm.R1, asm.Word),
	}
}

// memberOffset is the byte offset of a member path in a struct or union,
// looking through anonymous ones on the way.
func memberOffset(typ btf.Type, path []string) (uint32, error) {
	var ms []btf.Member
	switch c := btf.UnderlyingType(typ).(type) {
	case *btf.Struct:
		ms = c.Members
	case *btf.Union:
		ms = c.Members
	default:
		return 0, fmt.Errorf("%v is not a struct", typ)
	}
	if len(path) == 0 {
		return 0, nil
	}
	for _, m := range ms {
		switch {
		case m.Name == path[0]:
			o, err := memberOffset(m.Type, path[1:])
			if len(path) == 1 {
				o, err = 0, nil
			}
			return m.Offset.Bytes() + o, err
		case m.Name == "":
			if o, err := memberOffset(m.Type, path); err == nil {
				return m.Offset.Bytes() + o, nil
			}
		}
	}
	return 0, errors.New("no such member")
}

// tagName says which micro-flow an skb->priority tags, if any.
func tagName(prio uint32) string {
	if _, seq, ok := reorder.Tagged(prio); ok {
		return fmt.Sprintf("micro-flow %d", seq)
	}
	return fmt.Sprintf("untagged (%#x)", prio)
}

// metaProbe counts the skbs GRO takes in on dev in ns (tracepoint
// napi_gro_receive_entry) and how many of them still carry XDP metadata
// (skb_shared_info.meta_len): GRO compares that many bytes before the
// MAC header to tell flows apart, which after decapsulation are the outer
// headers' last bytes, not the metadata.
type metaProbe struct{ state *ebpf.Map } // {skbs, with metadata}

func newMetaProbe(t *testing.T, ns, dev string) *metaProbe {
	t.Helper()
	k, ok := kernelOf(t, ns, dev, "GRO probe on "+dev)
	if !ok {
		return nil
	}
	offDev := k.off("sk_buff", "dev")
	offHead := k.off("sk_buff", "head")
	offEnd := k.off("sk_buff", "end")
	offMetaLen := k.off("skb_shared_info", "meta_len")
	match := k.match(asm.R7)
	if !k.ok(t) {
		return nil
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord), // skb
		asm.LoadMem(asm.R7, asm.R6, offDev, asm.DWord),
		asm.JEq.Imm(asm.R7, 0, "pass"),
	}
	insns = append(insns, match...)
	insns = append(insns,
		asm.LoadMem(asm.R3, asm.R6, offHead, asm.DWord),
		asm.LoadMem(asm.R4, asm.R6, offEnd, asm.Word),
		asm.Add.Reg(asm.R3, asm.R4),
		asm.Add.Imm(asm.R3, int32(offMetaLen)),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.R10, -8, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R10),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 1),
		asm.FnProbeReadKernel.Call(),
		asm.LoadMem(asm.R8, asm.R10, -8, asm.Byte),
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.Add.Imm32(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.Word),
		asm.JEq.Imm(asm.R8, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R0, 4, asm.Word),
		asm.Add.Imm32(asm.R1, 1),
		asm.StoreMem(asm.R0, 4, asm.R1, asm.Word),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("pass"),
		asm.Return(),
	)
	if !k.attach(t, "gro_meta_probe", "napi_gro_receive_entry", insns) {
		return nil
	}
	return &metaProbe{state: m}
}

// says is what the probe saw, for a log line.
func (p *metaProbe) says(t *testing.T, dev string) string {
	t.Helper()
	if p == nil {
		return "no GRO probe on " + dev
	}
	v := make([]byte, 8)
	if err := p.state.Lookup(uint32(0), &v); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d of %d skbs into %s's GRO still carry XDP metadata", binary.LittleEndian.Uint32(v[4:8]), binary.LittleEndian.Uint32(v[0:4]), dev)
}
