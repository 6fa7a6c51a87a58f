//go:build linux

package steer

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// flowChunk is how many flows one batch syscall reads.
const flowChunk = 1024

// classHi is the bit of a flow's cpu_idx that says it uses the core's
// high-priority queue (bpf/consts.h's CLASS_HI); syncIdx is the cpu_idx of a
// flow on PRISM-sync's shortcut (SYNC_IDX). TestConstsMatchC checks both.
const (
	classHi = 0x40000000
	syncIdx = 0x20000000
)

// stayFresh, stayQueued and stayDirect are bpf/consts.h's STAY_FRESH,
// STAY_QUEUED and STAY_DIRECT: a bridge-stage flow that has to queue a
// counted frame before it may run on, one queuing counted (at the
// container stage: on the core in stay_cpu, stay_core), and one staying
// without the RPS backlog; stayMode is STAY_MODE, the bits they take.
// TestConstsMatchC checks them.
const (
	stayFresh  = 0
	stayQueued = 1
	stayDirect = 2
	stayMode   = 3
)

// Flow is a (flow, stage) the programs have placed.
type Flow struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	Stage            int
	CPUIndex         uint32        // index into Config.CPUs, or Stay
	High             bool          // in the core's high-priority queue, or on the sync shortcut (split stage, Config.Prio)
	Sync             bool          // on PRISM-sync's shortcut (Config.Sync); CPUIndex is Stay then
	Ifindex          int           // hook device of the last packet
	Bucket           int           // table bucket the datapath placed the last packet by
	LastSeen         time.Duration // CLOCK_MONOTONIC (ktime) of the last packet
	Packets, Bytes   uint64
	// InFlight is frames this stage queued that the next stage's program
	// has not seen yet (may dip below 0 briefly; see bpf/order.h's seen()).
	InFlight int64
	// Direct (bridge stage): the flow stays without a pass through the
	// RPS backlog (bpf/place.h's stay_direct); its frames in flight are then
	// on their way through the GRO cell, not queued.
	Direct bool
	// StayCore (container stage, staying): the core whose RPS backlog its
	// counted frames were queued on, which it holds while any is in
	// flight however the bridge stage's core changes (bpf/order.h's
	// stay_core); -1: none yet, or not staying.
	StayCore int
	// MicroFlow is the flow's MFLOW state at the stage that splits it.
	MicroFlow MicroFlowState
}

// Flows lists the flows in steer_flows, ordered by stage, then 5-tuple.
// The map is an LRU: flows idle for long may have been evicted.
func (d *Datapath) Flows() ([]Flow, error) {
	var flows []Flow
	err := d.eachFlow(func(k *steerSteerFlowKey, s *steerSteerFlowState) {
		flows = append(flows, Flow{
			Src:       beAddr(k.Saddr),
			Dst:       beAddr(k.Daddr),
			SrcPort:   bePort(k.Sport),
			DstPort:   bePort(k.Dport),
			Proto:     k.Proto,
			Stage:     int(k.Stage),
			CPUIndex:  cpuIndex(s.CpuIdx),
			High:      s.CpuIdx != Stay && (s.CpuIdx&classHi != 0 || s.CpuIdx == syncIdx),
			Sync:      s.CpuIdx == syncIdx,
			Ifindex:   int(s.Ifindex),
			Bucket:    int(s.Bucket),
			LastSeen:  time.Duration(s.LastNs),
			Packets:   s.Packets,
			Bytes:     s.Bytes,
			InFlight:  s.Inflight,
			Direct:    s.CpuIdx == Stay && s.Stay&stayMode == stayDirect,
			StayCore:  stayCore(k, s),
			MicroFlow: microFlowState(s),
		})
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(flows, func(a, b Flow) int {
		return cmp.Or(
			cmp.Compare(a.Stage, b.Stage),
			a.Src.Compare(b.Src),
			a.Dst.Compare(b.Dst),
			cmp.Compare(a.SrcPort, b.SrcPort),
			cmp.Compare(a.DstPort, b.DstPort),
			cmp.Compare(a.Proto, b.Proto),
		)
	})
	return flows, nil
}

// stayCore is Flow.StayCore.
func stayCore(k *steerSteerFlowKey, s *steerSteerFlowState) int {
	if int(k.Stage) != StageContainer || s.CpuIdx != Stay || s.Stay&stayMode != stayQueued {
		return -1
	}
	return int(s.StayCpu)
}

func cpuIndex(v uint32) uint32 {
	if v == Stay || v == syncIdx {
		return Stay
	}
	return v &^ classHi
}

// epochSlots is bpf/maps.h's EPOCH_SLOTS (TestConstsMatchC).
const epochSlots = 65536

// nextEpoch hands out the next count epoch of k's slot other than cur,
// as bpf/flow.h's next_epoch_after does (with the same race, and the same
// harmlessness).
func (d *core) nextEpoch(k *steerSteerFlowKey, cur uint32) uint32 {
	fh := FlowHash(addrOf(k.Saddr), addrOf(k.Daddr), htons16(k.Sport), htons16(k.Dport), k.Proto)
	slot := uint32(k.Stage)*epochSlots + fh%epochSlots
	var s steerFlowSlot
	if err := d.objs.SteerEpochs.Lookup(slot, &s); err != nil {
		return (cur + 1) % HashEpochs
	}
	if uint32(s.N)%HashEpochs == cur {
		s.N++
	}
	e := uint32(s.N) % HashEpochs
	s.N++
	_ = d.objs.SteerEpochs.Put(slot, &s)
	return e
}

// htons16 turns a __be16 field as Go reads it into the number it holds.
func htons16(v uint16) uint16 { return v>>8 | v<<8 }

// eachFlow calls fn for every entry of steer_flows, reading the map in
// batches: a handful of syscalls for thousands of flows where iterating
// takes two per entry. Entries the programs add or evict meanwhile may be
// missed or seen twice, as with any walk of a live hash map.
func (d *core) eachFlow(fn func(*steerSteerFlowKey, *steerSteerFlowState)) error {
	keys := make([]steerSteerFlowKey, flowChunk)
	vals := make([]steerSteerFlowState, flowChunk)
	var cur ebpf.MapBatchCursor
	for {
		n, err := d.objs.SteerFlows.BatchLookup(&cur, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("reading flows: %w", err)
		}
	}
}

// beAddr and bePort undo the host-order decoding of fields the programs
// copied from the packet in network order.
func beAddr(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func bePort(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

// nativeAddr and nativePort are their inverses: a value whose in-memory
// bytes are the network-order field.
func nativeAddr(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func nativePort(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// QuietAfter is how long after the last high-priority frame steer_xdp
// takes the high class for quiet under Config.PrioQuiet q: q, and the
// coarse clock's two ticks (it stamps and compares coarse times).
func QuietAfter(q time.Duration) time.Duration {
	return q + time.Duration(coarseLag())
}

// coarseLag is how far the coarse clock may trail the precise one: two of
// its steps (a tick each; the kernel reports the step as the coarse clock's
// resolution). 0, and every packet stamped precisely, if unknown.
func coarseLag() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil || ts.Nano() <= 0 {
		return 0
	}
	return 2 * uint64(ts.Nano())
}

// Now is the clock of Flow.LastSeen (bpf_ktime_get_ns: CLOCK_MONOTONIC)
// and of the programs' coarse stamps, so callers can tell how long a flow
// has been idle or a class quiet.
func Now() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}
