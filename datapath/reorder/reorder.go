//go:build linux

// Package reorder is MFLOW's in-order micro-flow reassembly on a stock
// kernel: a BPF qdisc (struct_ops Qdisc_ops, Linux 6.16 and newer built with
// CONFIG_NET_SCH_BPF) at the root of a container's host-side veth, which
// holds the frames of micro-flow k+1 of a split flow until micro-flow k is
// complete, so the container receives every split flow in order. The
// splitter (datapath/steer) tags each frame of a micro-flow in
// skb->priority (datapath/bpf/include/mflow_tag.h); untagged frames pass
// through a FIFO. reorder.c says how the merge works; docs/reorder.md why
// it sits there and what it costs.
//
// One loaded copy of the qdisc serves one device: each has its own qdisc
// kind (Kind), maps and struct_ops link, pinned in its own directory, so a
// later process (lanes status, a reset after a crash) finds them there.
package reorder

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/lanesnet/lanes/internal/kver"
)

//go:generate go tool bpf2go -cc clang-19 -no-global-types -type mf_config -type mf_counters -type mf_qstate -tags linux -target bpfel reorder reorder.c -- -I../bpf/include -I/usr/include/x86_64-linux-gnu

// MinKernel is the first Linux release with BPF qdiscs.
const MinKernel = "6.16"

// ErrNotSupported is matched (errors.Is) by the error Supported returns on
// a kernel without the BPF qdisc; it also matches ebpf.ErrNotSupported.
var ErrNotSupported = errors.New("BPF qdisc not supported")

// UnsupportedError says why this kernel has no BPF qdisc.
type UnsupportedError struct {
	Release string // the running kernel
	Why     string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("in-order reassembly needs the BPF qdisc (Linux %s or newer built with CONFIG_NET_SCH_BPF): %s", MinKernel, e.Why)
}

func (e *UnsupportedError) Is(target error) bool {
	return target == ErrNotSupported || target == ebpf.ErrNotSupported
}

// kernelSpec is btf.LoadKernelSpec, replaceable by tests.
var kernelSpec = btf.LoadKernelSpec

// Supported reports whether the running kernel can load the reassembler:
// nil, or an *UnsupportedError naming what is missing. The probe looks for
// the BPF qdisc's struct_ops type in the kernel's BTF, which exists exactly
// when the kernel was built with it (the feature cannot be a module).
func Supported() error {
	rel, _ := kver.Release()
	spec, err := kernelSpec()
	if err != nil {
		return &UnsupportedError{Release: rel, Why: fmt.Sprintf("this kernel (%s) has no readable BTF: %v", rel, err)}
	}
	var st *btf.Struct
	if err := spec.TypeByName("bpf_struct_ops_Qdisc_ops", &st); err != nil {
		why := fmt.Sprintf("this kernel (%s) was built without it", rel)
		if old, err := kver.AtLeast(rel, 6, 16); err == nil && !old {
			why = fmt.Sprintf("this kernel (%s) is older", rel)
		}
		return &UnsupportedError{Release: rel, Why: why}
	}
	return nil
}

// Config is how a reassembler merges.
type Config struct {
	// Batch is the splitter's frames per micro-flow: a micro-flow with
	// this many frames counted (GRO segments) is complete.
	Batch uint32
	// Cores is the number of split cores: a new flow's first micro-flows
	// race over them, so its first arrival may be any of the first Cores.
	Cores int
	// Timeout is the watchdog: a gap (a micro-flow that does not
	// complete, after a loss) is skipped once the flow has held frames
	// behind it this long without progress.
	Timeout time.Duration
	// FlowLimit and TotalLimit bound the frames held per flow and in all;
	// at a limit the oldest gap is skipped and what was held behind it
	// leaves in order.
	FlowLimit  uint32
	TotalLimit uint32
	// SelfCheck has the qdisc count the tagged frames it dequeues behind
	// a later micro-flow of their flow (Stats.Backward): a diagnostic for
	// tests, one map lookup per tagged frame; off, the loaded program
	// carries none of it.
	SelfCheck bool
}

// Sizes fixed when the qdisc is loaded.
const (
	// Windows is how many micro-flows of one flow may be stored at once
	// (reorder.c WINDOWS).
	Windows = 16
	// FlowSlots is how many split flows one device's qdisc tracks at once;
	// another split flow whose slot is taken passes unordered (counted in
	// collisions).
	FlowSlots = 8
	// FIFOSlots is the FIFO's length: untagged frames and frames passed in
	// order (the length of a veth's default transmit queue, rounded up).
	FIFOSlots = 1024
	// maxWindowSlots caps what one micro-flow may hold.
	maxWindowSlots = 8192
	minFlowLimit   = 512
)

// DefaultTimeout is the watchdog's default: many times what a core takes
// to run a 256-frame micro-flow through the overlay (CPU per datagram:
// docs/results/bpfcost-intel-2026-11-26/README.md), and above a 250 Hz
// tick, so a core preempted for one tick does not pass for a loss.
const DefaultTimeout = 10 * time.Millisecond

// DefaultConfig is the merge for a splitter's batch over cores: up to four
// micro-flows held per flow (at least minFlowLimit frames, so small
// batches ride out a core's stall of a few micro-flows), four flows' worth
// in all.
func DefaultConfig(batch uint32, cores int) Config {
	c := Config{Batch: batch, Cores: cores, Timeout: DefaultTimeout}
	c.FlowLimit = max(4*batch, minFlowLimit)
	if most := uint32(Windows-1) * windowSlots(batch); c.FlowLimit > most {
		c.FlowLimit = most
	}
	c.TotalLimit = 4 * c.FlowLimit
	return c
}

// windowSlots is what one micro-flow may hold: the batch, rounded up to a
// power of 2 (the ring's index is masked), at least 64.
func windowSlots(batch uint32) uint32 {
	n := max(batch, 64)
	if n > maxWindowSlots {
		n = maxWindowSlots
	}
	return 1 << bits.Len32(n-1)
}

// Check refuses a config the qdisc cannot run with, in one line.
func (c Config) Check() error {
	switch {
	case c.Batch == 0:
		return errors.New("reorder: batch must be at least 1 frame")
	case c.Cores < 1:
		return errors.New("reorder: at least one split core")
	case c.Timeout <= 0:
		return errors.New("reorder: the watchdog's timeout must be positive")
	case c.FlowLimit == 0 || c.TotalLimit == 0:
		return errors.New("reorder: the limits must be at least 1 frame")
	}
	return nil
}

// Kind is the qdisc kind (its tc name, at most 15 characters) of the
// reassembler loaded for device dev of namespace netns. Kinds are global
// to the kernel, so it hashes both.
func Kind(netns, dev string) string {
	h := fnv.New32a()
	h.Write([]byte(netns))
	h.Write([]byte{0})
	h.Write([]byte(dev))
	return fmt.Sprintf("lanes_mf_%06x", h.Sum32()&0xffffff)
}

// Stats are a reassembler's counters since it was loaded.
type Stats struct {
	// Passed: frames without a tag, straight through the FIFO.
	Passed uint64 `json:"passed"`
	// InOrder: tagged frames of the micro-flow being released while
	// nothing of their flow was held: through without waiting.
	InOrder uint64 `json:"in_order"`
	// Held: tagged frames held behind an earlier micro-flow; Released:
	// held frames released in order.
	Held     uint64 `json:"held"`
	Released uint64 `json:"released"`
	// Queued: tagged frames of a released micro-flow that queued behind
	// their flow's stored frames (in order, without being held).
	Queued uint64 `json:"queued"`
	// Gaps: micro-flows given up by the watchdog (lost frames);
	// Overflows: given up because a limit was reached.
	Gaps      uint64 `json:"gaps_skipped"`
	Overflows uint64 `json:"overflows"`
	// Late: frames of a micro-flow already given up or already gone,
	// passed as they came (they may be out of order).
	Late uint64 `json:"late"`
	// Drops: frames dropped because the FIFO was full.
	Drops uint64 `json:"drops"`
	// Collisions: tagged frames passed unordered because every flow
	// slot was another flow's, in use.
	Collisions uint64 `json:"collisions"`
	// Restarts: flow slots started over (a sequence jump, a slot taken
	// from a flow idle for a second).
	Restarts uint64 `json:"restarts"`
	// HeldMax is the most frames held at once; HeldNow what is held now.
	HeldMax uint64 `json:"held_max"`
	HeldNow uint64 `json:"held_now"`
	// ByCount and ByCore: micro-flows completed by their frame count, and
	// by their core moving on to a later one (MFLOW's rule).
	ByCount uint64 `json:"complete_by_count"`
	ByCore  uint64 `json:"complete_by_core"`
	// Backward (Config.SelfCheck): tagged frames dequeued behind a later
	// micro-flow of their flow. Late frames and collisions leave so by
	// design; any more is disorder of the qdisc's own.
	Backward uint64 `json:"backward,omitempty"`
}

func statsOf(c reorderMfCounters, q reorderMfQstate) Stats {
	return Stats{
		Passed: c.Passed, InOrder: c.InOrder, Held: c.Held, Released: c.Released, Queued: c.Queued, Gaps: c.Gaps,
		Overflows: c.Overflows, Late: c.Late, Drops: c.Drops, Collisions: c.Collisions, Restarts: c.Restarts,
		HeldMax: c.HeldMax, HeldNow: uint64(q.Held), ByCount: c.ByCount, ByCore: c.ByCore, Backward: c.Backward,
	}
}
