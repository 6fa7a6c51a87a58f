package steer

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
)

// Stages of the overlay receive path that steer places, the bucket count
// of each stage's table and the largest core set: bpf/consts.h's STAGE_*,
// NUM_STAGES, BUCKETS, MAX_CPUS and STAY, as TestConstsMatchC checks.
const (
	// StageSplit is XDP on the underlay NIC: skb allocation, GRO, outer
	// IP/UDP and VXLAN decap run on the chosen core (cpumap).
	StageSplit = 0
	// StageBridge is tc ingress on the underlay NIC: RPS on the VXLAN
	// device runs bridge + veth transmit on the chosen core.
	StageBridge = 1
	// StageContainer is tc egress on a container's host-side veth: RPS on
	// the container-side veth runs inner IP + TCP/UDP on the chosen core.
	StageContainer = 2
	NumStages      = 3

	Buckets = 256
	MaxCPUs = 64
	// Stay in a table bucket or a flow's state means "do not steer": the
	// stage runs where the kernel would run it anyway.
	Stay = ^uint32(0)
)

// StageName is the stage's name in reports and flags.
func StageName(s int) string {
	switch s {
	case StageSplit:
		return "split"
	case StageBridge:
		return "bridge"
	case StageContainer:
		return "container"
	}
	return fmt.Sprintf("stage%d", s)
}

// FlowHash is bpf/flow.h's flow_hash: murmur3_32 (seed 0) over the 5-tuple
// as four host-order words (source, destination, sport<<16|dport, proto).
// Addresses that are not IPv4 (never seen by the programs) hash as 0.0.0.0.
func FlowHash(src, dst netip.Addr, sport, dport uint16, proto uint8) uint32 {
	var h uint32
	h = mm3Round(h, ipv4Word(src))
	h = mm3Round(h, ipv4Word(dst))
	h = mm3Round(h, uint32(sport)<<16|uint32(dport))
	h = mm3Round(h, uint32(proto))
	return fmix32(h ^ 16)
}

func ipv4Word(a netip.Addr) uint32 {
	a = a.Unmap()
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func mm3Round(h, k uint32) uint32 {
	k *= 0xcc9e2d51
	k = bits.RotateLeft32(k, 15)
	k *= 0x1b873593
	h ^= k
	h = bits.RotateLeft32(h, 13)
	return h*5 + 0xe6546b64
}

func fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// Bucket is the table bucket a flow falls into at a stage on the device
// with ifindex: Falcon's hash_32(hash + ifindex, 16) with a stage term, so
// that one flow's stages are placed independently.
func Bucket(flowhash uint32, ifindex, stage int) int {
	v := flowhash + uint32(ifindex) + uint32(stage)*0x9E3779B9
	return int((v*0x61C88647)>>16) % Buckets
}

// rpsRange is the hash range [lo, lo+span) that the kernel's RPS maps to
// the idx-th of n cores: lo = ceil(idx*2^32/n), span = floor(2^32/n), the
// span capped at 2^32-1 for n = 1 (where every hash selects the only core).
func rpsRange(idx, n int) (lo, span uint32) {
	lo = uint32((uint64(idx)<<32 + uint64(n) - 1) / uint64(n))
	s := (uint64(1) << 32) / uint64(n)
	if s > 1<<32-1 {
		s = 1<<32 - 1
	}
	return lo, uint32(s)
}

// HashEpochs is how many counts a flow's later-stage frames can belong to
// (bpf/flow.h's HASH_EPOCHS), in bits 1-3 of the hash. hashCounted is the
// hash's low bit, bpf/flow.h's HASH_COUNTED. TestConstsMatchC checks both.
const (
	HashEpochs  = 8
	hashCounted = 1
)

// RPSHash is the skb hash steer's tc programs set for a frame of a flow at
// a later stage placed on the idx-th of n cores; RPS with the core set as
// its mask then runs the next stage there. Its low bit says whether the
// frame was counted into the flow's in-flight count (bpf/flow.h's
// HASH_COUNTED), the next three bits in which of the flow's counts (epoch),
// and the rest keeps flows, and a flow's stages, apart. It is never 0,
// which the stack reads as "no hash"; 0 means the programs set none (a core
// set too large to leave room).
func RPSHash(idx, n int, flowhash uint32, stage int, epoch uint32, counted bool) uint32 {
	lo, span := rpsRange(idx, n)
	if span < 2*2*HashEpochs {
		return 0
	}
	if stage == StageContainer {
		flowhash = fmix32(flowhash ^ 0x9e3779b9)
	}
	slots := (span - 1) / 2 / HashEpochs
	v := (lo+1)&^1 + (flowhash%slots*HashEpochs+epoch%HashEpochs)*2
	if counted {
		v |= hashCounted
	}
	if v == 0 {
		return 2
	}
	return v
}

// RPSIndex is the kernel's reciprocal_scale(hash, n): which of an RPS
// map's n cores a hash selects.
func RPSIndex(hash uint32, n int) int {
	return int(uint64(hash) * uint64(n) >> 32)
}

// XDP metadata steer_xdp puts in front of a frame it hands to the cpumap
// (datapath/bpf/include/lanes_meta.h): magic, then flags; with metaMFlow,
// then the micro-flow's sequence number. TestConstsMatchC checks them
// against its LANES_META_* and its structs' sizes.
const (
	metaMagic  = 0x4c4e5331 // "LNS1"
	metaQueued = 0x1        // counted in its (flow, split stage)'s in-flight frames
	metaMFlow  = 0x2        // part of a micro-flow: the sequence number follows
	metaLen    = 8          // struct lanes_meta
	metaMFLen  = 12         // struct lanes_meta_mflow
	// Bits 0-1 of the flags are the flags above; bits 2-4 the count
	// epoch of the flow's split-stage state the frame was counted in.
	metaFlagMask   = 0x3
	metaEpochShift = 2
	// Bits 8-15: the core whose queue accounting counted the frame in,
	// plus one; 0: none.
	metaQIDShift = 8
	// Bits 16-31: the marking datapath's generation (metaGen).
	metaGenShift = 16
)
