package prism

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/lanesnet/lanes/topology"
)

// What may the packet filters do to an overlay datagram on its way from
// the underlay to the VXLAN socket? PRISM-sync skips that path, so under
// sync-netfilter=trust (the operator's word that no rule acts on the
// overlay's frames) lanes still reads the rules and refuses the trust
// where it can see one that may: a rule that tests the VXLAN port, one
// that may match the datagram and does anything but accept it or count
// it, a base chain whose policy drops. The reading is conservative: what
// a rule tests that lanes does not model (conntrack state, sets, marks,
// most xtables matches) may match.

// outerModel is the datagram the kernel hands to the VXLAN socket: IPv4,
// UDP to Port, from one of VTEPs to one of Locals, in on Dev (Ifindex).
type outerModel struct {
	Port    uint16
	VTEPs   []netip.Addr
	Locals  []netip.Addr
	Dev     string
	Ifindex int
}

// outerHooks are the base chains an incoming datagram meets, by family:
// ingress on its device, prerouting, input.
var outerHooks = map[string][]string{
	"ip":     {"prerouting", "input", "ingress"},
	"inet":   {"prerouting", "input", "ingress"},
	"netdev": {"ingress"},
}

// outerActors lists, for people, each rule or policy in f that may act on
// the model's datagrams; nil when none can.
func outerActors(f topology.Filters, m outerModel) []string {
	chains := map[string]*topology.FilterChain{}
	for i := range f.Chains {
		c := &f.Chains[i]
		chains[c.Source+"\x00"+c.Family+"\x00"+c.Table+"\x00"+c.Name] = c
	}
	var out []string
	for i := range f.Chains {
		c := &f.Chains[i]
		if !slices.Contains(outerHooks[c.Family], c.Hook) {
			continue
		}
		if len(c.Devices) > 0 && !slices.Contains(c.Devices, m.Dev) {
			continue
		}
		if c.Policy == "drop" {
			out = append(out, fmt.Sprintf("%s: policy drop", chainLabel(c)))
		}
		out = append(out, chainActors(c, chains, m, map[*topology.FilterChain]bool{c: true})...)
	}
	return out
}

func chainLabel(c *topology.FilterChain) string {
	if c.Source == "iptables" {
		return fmt.Sprintf("iptables %s %s", c.Table, c.Name)
	}
	return fmt.Sprintf("nftables %s %s %s", c.Family, c.Table, c.Name)
}

// chainActors goes through c's rules (and the chains they jump to).
func chainActors(c *topology.FilterChain, chains map[string]*topology.FilterChain, m outerModel, on map[*topology.FilterChain]bool) []string {
	var out []string
	for _, r := range c.Rules {
		ev := evalRule(r, m)
		if !ev.mayMatch {
			continue
		}
		label := fmt.Sprintf("%s rule %d", chainLabel(c), r.Handle)
		switch {
		case ev.port:
			out = append(out, label+": tests the VXLAN port")
		case ev.acts != "":
			out = append(out, label+": "+ev.acts)
		}
		if ev.jump != "" {
			next := chains[c.Source+"\x00"+c.Family+"\x00"+c.Table+"\x00"+ev.jump]
			switch {
			case next == nil:
				out = append(out, label+": jumps to chain "+ev.jump+", which was not read")
			case !on[next]:
				on[next] = true
				out = append(out, chainActors(next, chains, m, on)...)
			}
		}
	}
	return out
}

// ruleEval is what a rule may do to the model's datagram.
type ruleEval struct {
	mayMatch bool   // the datagram may match every test of the rule
	port     bool   // a test on the destination port holds for the VXLAN port
	acts     string // what it does besides accepting or counting ("" nothing)
	jump     string // the chain it jumps or goes to
}

// regVal is a register's content: the values it may hold (nil: any),
// and whether they come from the UDP destination port.
type regVal struct {
	vals  [][]byte
	dport bool
}

// slot is a register's first 32-bit slot (NFT_REG_1..4 are 16 bytes).
func slot(r uint32) int {
	if r >= 8 {
		return int(r - 8)
	}
	return int(r-1) * 4
}

func evalRule(r topology.FilterRule, m outerModel) ruleEval {
	ev := ruleEval{mayMatch: true}
	regs := map[int]regVal{}
	set := func(r uint32, v regVal) { regs[slot(r)] = v }
	get := func(r uint32) regVal { return regs[slot(r)] }
	for _, e := range r.Exprs {
		switch e.Name {
		case "meta":
			if e.SReg != 0 && e.DReg == 0 {
				ev.acts = "sets meta " + fmt.Sprint(e.Key)
				continue
			}
			set(e.DReg, regVal{vals: m.meta(e.Key)})
		case "payload":
			if e.SReg != 0 && e.DReg == 0 {
				ev.acts = "rewrites the packet"
				continue
			}
			set(e.DReg, m.payload(e.Base, e.Offset, e.Len))
		case "bitwise":
			set(e.DReg, bitwise(get(e.SReg), e))
		case "cmp":
			v := get(e.SReg)
			match := v.vals == nil || slices.ContainsFunc(v.vals, func(b []byte) bool { return cmpHolds(b, e.Op, e.Data) })
			if v.dport && match {
				ev.port = true
			}
			if !match {
				ev.mayMatch = false
				return ev
			}
		case "range":
			v := get(e.SReg)
			match := v.vals == nil || slices.ContainsFunc(v.vals, func(b []byte) bool {
				in := bytes.Compare(b, e.Data) >= 0 && bytes.Compare(b, e.Data2) <= 0
				return in == (e.Op == 0) // NFT_RANGE_EQ
			})
			if v.dport && match {
				ev.port = true
			}
			if !match {
				ev.mayMatch = false
				return ev
			}
		case "lookup":
			if get(e.SReg).dport {
				ev.port = true // a set of ports: lanes does not read sets
			}
			if e.DReg != 0 {
				set(e.DReg, regVal{})
			}
		case "immediate":
			if !e.HasVerdict {
				set(e.DReg, regVal{vals: [][]byte{e.Data}})
				continue
			}
			switch e.Verdict {
			case topology.NFDrop:
				ev.acts = "drops"
			case topology.NFQueue:
				ev.acts = "queues to user space"
			case topology.NFTJump, topology.NFTGoto:
				ev.jump = e.Chain
			}
		case "match":
			switch xtMatch(e, m) {
			case xtNo:
				ev.mayMatch = false
				return ev
			case xtPort:
				ev.port = true
			}
		case "target":
			switch e.XName {
			case "LOG", "NFLOG", "TRACE":
			default:
				ev.acts = "target " + e.XName
			}
		case "counter", "log", "limit", "quota", "connlimit", "last", "dynset":
			// Count, log, or test a rate: nothing done to the packet.
		case "ct", "fib", "rt", "socket", "numgen", "hash", "exthdr", "osf", "xfrm", "tunnel", "inner", "jhash", "symhash":
			if e.SReg != 0 && e.DReg == 0 {
				ev.acts = e.Name + " set"
				continue
			}
			if e.DReg != 0 {
				set(e.DReg, regVal{})
			}
		default:
			ev.acts = "expression " + e.Name
		}
	}
	return ev
}

// meta is a meta key's value for the model (nil: unknown).
func (m outerModel) meta(key uint32) [][]byte {
	ne := binary.NativeEndian
	switch key {
	case 15: // NFPROTO
		return [][]byte{{2}} // NFPROTO_IPV4
	case 1: // PROTOCOL
		return [][]byte{{0x08, 0x00}}
	case 16: // L4PROTO
		return [][]byte{{17}}
	case 4: // IIF
		return [][]byte{ne.AppendUint32(nil, uint32(m.Ifindex))}
	case 6: // IIFNAME
		b := make([]byte, 16)
		copy(b, m.Dev)
		return [][]byte{b}
	case 7: // OIFNAME: none before routing and on input
		return [][]byte{make([]byte, 16)}
	case 8: // IIFTYPE
		return [][]byte{ne.AppendUint16(nil, 1)} // ARPHRD_ETHER
	case 19: // PKTTYPE
		return [][]byte{{0}} // PACKET_HOST
	}
	return nil
}

// payload is a header window's possible values for the model.
func (m outerModel) payload(base, off, n uint32) regVal {
	var v regVal
	if base == 2 && off < 4 && off+n > 2 { // transport header: the ports
		v.dport = true
		if off == 2 && n == 2 {
			v.vals = [][]byte{binary.BigEndian.AppendUint16(nil, m.Port)}
		}
		return v
	}
	if base != 1 { // link layer, tunnels, inner headers: unknown
		return v
	}
	type field struct {
		off, n uint32
		vals   [][]byte
	}
	addrs := func(as []netip.Addr) [][]byte {
		var out [][]byte
		for _, a := range as {
			b := a.As4()
			out = append(out, b[:])
		}
		return out
	}
	fields := []field{
		{0, 1, [][]byte{{0x45}}},
		{6, 2, [][]byte{{0, 0}, {0x40, 0}}}, // frag_off: no fragment (DF or not)
		{9, 1, [][]byte{{17}}},
		{12, 4, addrs(m.VTEPs)},
		{16, 4, addrs(m.Locals)},
	}
	vals := [][]byte{{}}
	for pos := off; pos < off+n; {
		i := slices.IndexFunc(fields, func(f field) bool { return f.off == pos })
		if i < 0 || fields[i].off+fields[i].n > off+n || len(fields[i].vals) == 0 {
			return v // a byte lanes does not model
		}
		var next [][]byte
		for _, a := range vals {
			for _, b := range fields[i].vals {
				next = append(next, append(slices.Clone(a), b...))
			}
		}
		if len(next) > 256 {
			return v
		}
		vals, pos = next, pos+fields[i].n
	}
	v.vals = vals
	return v
}

// bitwise applies a mask-and-xor (NFT_BITWISE_BOOL) to every value.
func bitwise(in regVal, e topology.FilterExpr) regVal {
	out := regVal{dport: in.dport}
	if in.vals == nil || e.Op != 0 || len(e.Data) != int(e.Len) || len(e.Data2) != int(e.Len) {
		return out
	}
	for _, b := range in.vals {
		if len(b) != int(e.Len) {
			return regVal{dport: in.dport}
		}
		r := make([]byte, len(b))
		for i := range b {
			r[i] = b[i]&e.Data[i] ^ e.Data2[i]
		}
		out.vals = append(out.vals, r)
	}
	return out
}

// cmpHolds is nft_cmp on a register value (memcmp over the data's length).
func cmpHolds(v []byte, op uint32, data []byte) bool {
	if len(v) < len(data) {
		return true // not modelled: may hold
	}
	d := bytes.Compare(v[:len(data)], data)
	switch op {
	case 0:
		return d == 0
	case 1:
		return d != 0
	case 2:
		return d < 0
	case 3:
		return d <= 0
	case 4:
		return d > 0
	case 5:
		return d >= 0
	}
	return true
}

type xtResult int

const (
	xtMay  xtResult = iota // may match
	xtNo                   // cannot match the model's datagram
	xtPort                 // matches by the VXLAN port
)

// xtMatch evaluates the xtables matches lanes models.
func xtMatch(e topology.FilterExpr, m outerModel) xtResult {
	ne := binary.NativeEndian
	inRange := func(lo, hi uint16, inv bool) bool { return (m.Port >= lo && m.Port <= hi) != inv }
	switch e.XName {
	case "comment":
		return xtMay
	case "tcp", "icmp", "sctp", "dccp", "esp", "ah":
		return xtNo // their rules must name that protocol, not UDP
	case "udp":
		if len(e.Info) < 9 {
			return xtMay
		}
		// struct xt_udp: spts[2], dpts[2], invflags (host byte order)
		if ne.Uint16(e.Info[4:]) == 0 && ne.Uint16(e.Info[6:]) == 0xffff && e.Info[8]&0x02 == 0 {
			return xtMay // no destination port given
		}
		if inRange(ne.Uint16(e.Info[4:]), ne.Uint16(e.Info[6:]), e.Info[8]&0x02 != 0) {
			return xtPort
		}
		return xtNo
	case "multiport":
		if e.XRev != 1 || len(e.Info) < 2+30+15+1 {
			return xtMay
		}
		// struct xt_multiport_v1: flags, count, ports[15], pflags[15], invert
		flags, count, invert := e.Info[0], int(min(e.Info[1], 15)), e.Info[2+30+15] != 0
		if flags == 0 { // source ports only: the source port is unknown
			return xtMay
		}
		hit := false
		for i := 0; i < count; i++ {
			lo := ne.Uint16(e.Info[2+2*i:])
			hi := lo
			if e.Info[32+i] != 0 && i+1 < count {
				hi = ne.Uint16(e.Info[2+2*(i+1):])
				i++
			}
			if m.Port >= lo && m.Port <= hi {
				hit = true
			}
		}
		switch {
		case hit != invert:
			return xtPort
		case flags == 2: // either port: the source may still match
			return xtMay
		}
		return xtNo
	}
	return xtMay
}
