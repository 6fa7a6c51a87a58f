//go:build linux

package steer

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// tcCase is one of the two tc programs with the frames it parses.
type tcCase struct {
	name  string
	stage int
	prog  func(*Datapath) *ebpf.Program
	frame func(frameSpec) []byte
}

var tcCases = []tcCase{
	{"ingress", StageBridge, (*Datapath).TCIngress, vxlanFrame},
	{"egress", StageContainer, (*Datapath).TCEgress, innerFrame},
}

// The skb hash the programs set is not visible through BPF_PROG_RUN, so
// the tests check the placement (flow state) here and the hash in
// TestRPSHashSelectsCore.
func TestTCSteers(t *testing.T) {
	for _, tc := range tcCases {
		t.Run(tc.name, func(t *testing.T) {
			d, cores := newDatapath(t)
			if err := d.Placement().SetTable(tc.stage, spreadTable(len(cores))); err != nil {
				t.Fatal(err)
			}
			var specs []frameSpec
			for i := range 8 {
				specs = append(specs,
					frameSpec{flow: tcpFlow(uint16(40000 + i))},
					frameSpec{flow: udpFlow(uint16(40000 + i)), payload: 100})
			}
			specs = append(specs, frameSpec{flow: tcpFlow(50000), outerIP: ipSpec{ihl: 15}, innerIP: ipSpec{ihl: 15}})
			for _, s := range specs {
				frame := tc.frame(s)
				ret, out := runTC(t, tc.prog(d), frame)
				if ret != tcUnspec {
					t.Errorf("flow %+v: verdict %d, want TC_ACT_UNSPEC", s.flow, int32(ret))
				}
				sameBytes(t, "steered frame", frame, out)
				fl := mustFlow(t, d, s.flow, tc.stage)
				want := uint32(Bucket(s.flow.hash(), loIfindex, tc.stage) % len(cores))
				if fl.CPUIndex != want || fl.Ifindex != loIfindex || fl.Bytes != uint64(len(frame)) {
					t.Errorf("flow %+v: state %+v, want index %d on ifindex %d, %d bytes",
						s.flow, fl, want, loIfindex, len(frame))
				}
			}
			if st := stats(t, d)[tc.stage]; st != (Counters{Steered: uint64(len(specs))}) {
				t.Errorf("counters %+v, want %d steered", st, len(specs))
			}
		})
	}
}

func TestTCStay(t *testing.T) {
	for _, tc := range tcCases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newDatapath(t)
			f := udpFlow(40000)
			frame := tc.frame(frameSpec{flow: f})
			ret, out := runTC(t, tc.prog(d), frame)
			if ret != tcUnspec {
				t.Errorf("verdict %d, want TC_ACT_UNSPEC", int32(ret))
			}
			sameBytes(t, "stayed frame", frame, out)
			if fl := mustFlow(t, d, f, tc.stage); fl.CPUIndex != Stay {
				t.Errorf("flow index %d, want Stay", fl.CPUIndex)
			}
			if st := stats(t, d)[tc.stage]; st != (Counters{Stayed: 1}) {
				t.Errorf("counters %+v, want 1 stayed", st)
			}
		})
	}
}

// innerMalformed are container frames steer_tc_egress must not touch.
func innerMalformed() map[string][]byte {
	tcp := tcpFlow(40000)
	icmp := tcp
	icmp.proto = protoICMP
	frames := map[string][]byte{}
	for name, s := range map[string]frameSpec{
		"VLAN tag":   {flow: tcp, innerVLAN: true},
		"IPv6":       {flow: tcp, innerEthType: ethIPv6},
		"ARP":        {flow: tcp, innerEthType: ethARP},
		"other type": {flow: tcp, innerEthType: 0x88b5},
		"MF":         {flow: tcp, innerIP: ipSpec{frag: 0x2000}},
		"offset":     {flow: tcp, innerIP: ipSpec{frag: 0x0100}},
		"IHL 4":      {flow: tcp, innerIP: ipSpec{ihl: 4}},
		"version 6":  {flow: tcp, innerIP: ipSpec{version: 6}},
		"ICMP":       {flow: icmp},
	} {
		frames[name] = innerFrame(s)
	}
	return frames
}

func TestTCMalformedPassUntouched(t *testing.T) {
	for _, tc := range tcCases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newDatapath(t)
			tcMalformedPassUntouched(t, d, tc)
		})
	}
}

// tcMalformedPassUntouched runs the malformed frames of a tc stage through
// its program with every bucket steering: each must pass untouched and
// create no flow.
func tcMalformedPassUntouched(t *testing.T, d *Datapath, tc tcCase) {
	t.Helper()
	setAll(t, d, tc.stage, 0)
	frames := innerMalformed()
	if tc.stage == StageBridge {
		frames = outerMalformed()
	}
	for name, frame := range frames {
		ret, out := runTC(t, tc.prog(d), frame)
		if ret != tcUnspec {
			t.Errorf("%s: verdict %d, want TC_ACT_UNSPEC", name, int32(ret))
		}
		sameBytes(t, name, frame, out)
	}
	if st := stats(t, d)[tc.stage]; st != (Counters{Passed: uint64(len(frames))}) {
		t.Errorf("counters %+v, want %d passed", st, len(frames))
	}
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Errorf("malformed frames created flows: %+v", flows)
	}
}

func TestTCTruncated(t *testing.T) {
	for _, tc := range tcCases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newDatapath(t)
			setAll(t, d, tc.stage, 0)
			passed, steered := 0, 0
			for _, s := range []frameSpec{
				{flow: tcpFlow(40000)},
				{flow: udpFlow(40000), innerIP: ipSpec{ihl: 7}},
			} {
				full := tc.frame(s)
				for n := range len(full) {
					frame := full[:n:n]
					out := make([]byte, n+256)
					opts := ebpf.RunOptions{Data: frame, DataOut: out}
					ret, err := tc.prog(d).Run(&opts)
					if err != nil {
						// BPF_PROG_RUN refuses skbs shorter than an
						// Ethernet header and, since 6.x, IPv4 skbs
						// shorter than an IPv4 header; the XDP test
						// covers those cuts for the shared parsers.
						if n >= ethHeaderLen+20 || !errors.Is(err, unix.EINVAL) {
							t.Errorf("cut to %d bytes: %v", n, err)
						}
						continue
					}
					if ret != tcUnspec {
						t.Errorf("cut to %d bytes: verdict %d", n, int32(ret))
					}
					sameBytes(t, "truncated", frame, opts.DataOut)
					passed++
				}
				runTC(t, tc.prog(d), full)
				steered++
			}
			if st := stats(t, d)[tc.stage]; st != (Counters{Passed: uint64(passed), Steered: uint64(steered)}) {
				t.Errorf("counters %+v, want %d passed, %d steered", st, passed, steered)
			}
		})
	}
}

func TestTCDisabled(t *testing.T) {
	for _, tc := range tcCases {
		t.Run(tc.name, func(t *testing.T) {
			d, cores := newDatapath(t)
			setAll(t, d, tc.stage, 0)
			if err := d.SetConfig(Config{CPUs: cores, VXLANPort: testPort, VNIs: []uint32{testVNI}}); err != nil {
				t.Fatal(err)
			}
			frame := tc.frame(frameSpec{flow: tcpFlow(1)})
			ret, out := runTC(t, tc.prog(d), frame)
			if ret != tcUnspec {
				t.Errorf("verdict %d, want TC_ACT_UNSPEC", int32(ret))
			}
			sameBytes(t, "disabled", frame, out)
			if st := stats(t, d)[tc.stage]; st != (Counters{Disabled: 1}) {
				t.Errorf("counters %+v, want 1 disabled", st)
			}
		})
	}
}
