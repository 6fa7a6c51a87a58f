package steer

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Config is the steer programs' configuration. Its mode (every setting
// but the core set, the move rules, the port and the VNIs) is fixed when
// the programs are loaded (LoadFor; SetConfig loads them again for another
// one), so the verifier drops the code of what it leaves out; the rest
// they read on every packet.
type Config struct {
	// Enabled off makes every program pass everything untouched.
	Enabled bool
	// CPUs is the core set table entries index into. Stored ascending,
	// because that is the order in which RPS lists the cores of its mask,
	// and the tc programs' hashes rely on it.
	CPUs []int
	// Flowlet is the idle gap after which a flow may follow a changed
	// table entry to another core; 0 moves flows at once (order may break).
	Flowlet time.Duration
	// Drain bounds the wait for a flow's old queue to empty: a flow whose
	// frames the next stage has not all seen moves only after this long
	// idle (the missing frames were dropped). Not at the split stage's
	// tracked cpumap queues, which tell dropped frames from queued ones
	// (TrackQueues) and never give up on the latter. 0 moves on the
	// flowlet gap alone, as if every queue were always empty.
	Drain time.Duration
	// VXLANPort is the outer UDP destination port of overlay frames.
	VXLANPort uint16
	// VNIs are the overlay networks steered; frames of others pass.
	VNIs []uint32
	// CountSplit makes steer_xdp mark and count the split stage's frames
	// in flight, so split-stage moves wait for the cpumap queue to drain.
	// Set it only while steer_tc_ingress or steer_tc_split_seen runs on
	// the underlay's tc ingress: they count the frames seen, and without
	// them the counts never drain (every move would wait for Drain).
	CountSplit bool
	// Prio classifies every flow at the split stage against the priority
	// rules (AddRule): high-priority flows go to the chosen core's
	// high-priority queue (Datapath.HiCPUMap), PRISM's second class.
	Prio bool
	// NoBridgeCount stops steer_tc_ingress from counting the bridge
	// stage's frames in flight. Set it while steer_tc_egress, which counts
	// them seen, is not attached (MFLOW splitting at the bridge alone), or
	// the counts only grow; bridge-stage moves then wait for the flowlet
	// gap alone.
	NoBridgeCount bool
	// StayQueued keeps a flow staying at the bridge stage on the RPS
	// backlog of its own core, as lanes did before that stage ran such
	// flows on (bpf/place.h's stay_direct): one more pass through the backlog
	// than vanilla makes, for measuring what running on changes.
	StayQueued bool
	// MFlow splits elephant flows into micro-flows; the zero value is off.
	MFlow MFlow
	// Sync (with Prio) hands high-priority frames whose destination is in
	// the sync set (Sync.Set) straight to the container's veth: PRISM-sync.
	Sync bool
	// PrioIdleInline (with Prio and CountSplit) keeps bulk flows whose
	// first stage the table puts on InlineCPU in the NIC poll, vanilla's
	// path, while the priority set holds no rule: with nothing to preempt
	// for, the bulk queue's hop only costs. With the first rule each flow
	// takes the queue as soon as none of its frames is left behind in
	// the NIC poll (whose frames are counted in flight only while such a
	// move waits), without an idle gap; see bpf/place.h's place() and
	// mark_inline.
	PrioIdleInline bool
	// InlineCPU (with PrioIdleInline) is the core the NIC is polled on
	// alone, one of CPUs: the one core where the NIC poll and the queues
	// run one after another, so a flow moves between them in order at
	// once. With a single core in CPUs, that core.
	InlineCPU int
	// PrioQuiet (with PrioIdleInline; 0: off) keeps bulk flows in the NIC
	// poll also while rules exist but no high-priority frame arrived for
	// this long (whole milliseconds, up to MaxPrioQuiet), plus the coarse
	// clock's two ticks (QuietAfter); before the first one, at once. The first
	// high-priority frame ends the quiet at once and bulk flows take their
	// queue as after a rule's arrival; that frame itself finds bulk in the
	// NIC poll, as vanilla would.
	PrioQuiet time.Duration
	// HighAutoPPS (with PrioIdleInline; 0: off) is PRISM's high=auto: the
	// high-priority frame rate from which lanes agent runs the class in
	// the NIC poll (SetHighInline). The programs only check that it is
	// set: SetHighInline is refused, and its switch ignored, without it.
	HighAutoPPS uint32
	// BulkQuiet (with HighAutoPPS; 0: off) also runs high-priority flows
	// in the NIC poll while no bulk frame arrived for this long (whole
	// milliseconds, up to MaxPrioQuiet, plus the coarse clock's two ticks):
	// with no bulk work there is nothing to preempt, and the queue's
	// kthread would have to wake for every frame of a light flow. The
	// first bulk frame ends it at once; the flows move back to their
	// queue in order.
	BulkQuiet time.Duration
	// BulkAuto (with HighAutoPPS; 0: off) also runs bulk flows in the NIC
	// poll while high-priority frames came in the last BulkAuto (plus
	// the coarse clock's two ticks) and every one of them ran in the NIC
	// poll as a busy rule's (SetHighInline): no marked frame then waits
	// in a queue, and the bulk queue's hop only costs. The first marked
	// frame that takes its queue ends it at once; bulk flows move back to
	// their queue in order.
	BulkAuto time.Duration
	// AsideBelow (with HighAutoPPS and BulkAuto; 0: off) is PRISM's
	// aside-below, percent of InlineCPU: lanes agent stands PRISM aside
	// (Prio.SetAside) while that core's receive work stays under it. The
	// programs only check that it is set: SetAside is refused, and its
	// deadline ignored, without it.
	AsideBelow uint32
	// AsideDepth (with AsideBelow; 0: receive work alone) is PRISM's
	// aside-depth in hundredths of a frame: where lanes agent can count
	// the underlay NIC's polls on InlineCPU, it stands PRISM aside while
	// they find fewer frames than this each, on average, instead of
	// reading the receive work. Read by the agent only.
	AsideDepth uint32
	// VethClass (with Prio, not Sync) turns on steer_tc_veth_class and
	// steer_tc_veth_seen: each class takes its own receive queue of the
	// container-side veths they are attached to (PRISM's per-stage queues
	// at the container stage).
	VethClass bool
	// Fast turns on the fast path into the container (bpf/fast.h):
	// steer_tc_fast on the underlay's tc ingress, steer_tc_fast_learn on
	// the host-side veths' tc egress. It admits and uses nothing until
	// lanes agent vouches for the path (Fast.SetPath, Fast.Renew).
	Fast bool
	// FastIdle (with Fast) is how long an entry may go unused before it
	// is void: whole milliseconds, up to MaxPrioQuiet.
	FastIdle time.Duration
	// FastNoGSO (with Fast) leaves GSO frames at a VXLAN device's fast
	// path (steer_tc_fast_vx) to the kernel's path, as the underlay's
	// always does.
	FastNoGSO bool
	// FastBeside (with Fast) runs the fast path beside another mode whose
	// programs count frames through their queues (falcon, PRISM): a frame
	// it takes is counted out of the first stage's queue and given a hash
	// no later stage counts out. The fast path alone does neither.
	FastBeside bool
}

// DefaultFastIdle is the fast path's idle timeout unless a mode sets
// another: an entry idle that long is deleted at its flow's next frame,
// which takes the kernel's path and so makes it anew.
const DefaultFastIdle = 10 * time.Second

// MaxPrioQuiet is the longest Config.PrioQuiet.
const MaxPrioQuiet = time.Hour

// MaxAsideDepth bounds Config.AsideDepth (hundredths of a frame): a NAPI
// poll takes at most its budget, 64 frames.
const MaxAsideDepth = 6400

// SplitAt is where MFLOW splits elephant flows.
type SplitAt uint8

const (
	// SplitOff: no flow is split.
	SplitOff SplitAt = iota
	// SplitAtIRQ splits in steer_xdp on the underlay, before skb
	// allocation: each micro-flow goes to its core's cpumap entry (give
	// every split core one), and everything after the NIC poll runs there.
	SplitAtIRQ
	// SplitAtBridge splits in steer_tc_ingress on the underlay: each
	// micro-flow gets the skb hash RPS on the VXLAN device maps to its
	// core (set that device's RPS mask to Config.CPUs), so everything
	// after VXLAN's GRO cell runs there.
	SplitAtBridge
)

// String is the name the mflow policy's "at" setting uses.
func (a SplitAt) String() string {
	switch a {
	case SplitOff:
		return "off"
	case SplitAtIRQ:
		return "irq"
	case SplitAtBridge:
		return "bridge"
	}
	return fmt.Sprintf("split-at-%d", uint8(a))
}

// MFlow is MFLOW's splitting: a flow whose rate reaches Threshold frames
// within Window (an elephant) is cut into micro-flows of Batch consecutive
// frames, and micro-flow k goes to Cores[(k + r) % len(Cores)], r chosen
// per cut so that its first micro-flow runs on the core that polled the
// flow (bpf/mflow.h's cut_rotation). Micro-flows of
// one flow run in parallel and may overtake each other: a stock kernel
// cannot reassemble them before TCP/UDP, so splitting reorders by design.
// Mice keep the placement the tables give them.
type MFlow struct {
	At SplitAt
	// Batch is the number of frames per micro-flow (GRO-merged skbs count
	// their segments at the bridge).
	Batch uint32
	// Cores are the split cores (core numbers, each in Config.CPUs), in
	// dispatch order.
	Cores []int
	// Threshold is how many frames a flow must carry within one Window to
	// be an elephant; 0 makes every flow one from its first frame.
	Threshold uint32
	// Window is the elephant test's rate window.
	Window time.Duration
	// Quiet (with a reassembler; 0: none) keeps an elephant split until
	// the flow has been idle this long, instead of letting it fall back
	// when its rate drops: frames after a fall back carry no tag, and a
	// reassembler that still holds part of the flow would let them pass
	// it (bpf/mflow.h's elephant). At most MaxMFlowQuiet.
	Quiet time.Duration
}

// MaxMFlowQuiet bounds MFlow.Quiet: twice the reassembler's longest
// timeout.
const MaxMFlowQuiet = 20 * time.Second

// MaxBatch is the largest micro-flow batch the datapath takes.
const MaxBatch = 65536

// Defaults of Config's move rules, for every policy that moves flows.
const (
	// DefaultFlowlet: frames still queued are waited for by their count,
	// not by the gap; the gap only has to cover the short tail of a stage
	// after the point where its frames are counted seen.
	DefaultFlowlet = time.Millisecond
	// DefaultDrain is longer than a backlog (or an untracked cpumap
	// kthread) usually waits for its core on a PREEMPT_NONE kernel (a few
	// scheduler slices), so dropped frames, not queued ones, are given up
	// on; a SCHED_IDLE kthread under a busy task can wait far longer,
	// which is why tracked queues do not use it.
	DefaultDrain = 20 * time.Millisecond
)

// maxVNIs is steer_vni's size (TestConstsMatchC checks it in the object).
const maxVNIs = 64

// normalized checks c and returns it with CPUs sorted and VNIs sorted and
// deduplicated, as stored.
func (c Config) normalized() (Config, error) {
	switch {
	case len(c.CPUs) == 0:
		return c, errors.New("config has no cores")
	case len(c.CPUs) > MaxCPUs:
		return c, fmt.Errorf("config has %d cores, at most %d", len(c.CPUs), MaxCPUs)
	case c.VXLANPort == 0:
		return c, errors.New("config has VXLAN port 0")
	case c.Flowlet < 0:
		return c, fmt.Errorf("flowlet gap %v is negative", c.Flowlet)
	case c.Drain < 0:
		return c, fmt.Errorf("drain timeout %v is negative", c.Drain)
	}
	cpus := slices.Sorted(slices.Values(c.CPUs))
	for i, cpu := range cpus {
		if cpu < 0 || cpu >= MaxCPUs {
			// The cpumap is indexed by core number.
			return c, fmt.Errorf("core %d: must be 0..%d", cpu, MaxCPUs-1)
		}
		if i > 0 && cpus[i-1] == cpu {
			return c, fmt.Errorf("core %d listed twice", cpu)
		}
	}
	vnis := slices.Compact(slices.Sorted(slices.Values(c.VNIs)))
	if len(vnis) > maxVNIs {
		return c, fmt.Errorf("config has %d VNIs, at most %d", len(vnis), maxVNIs)
	}
	for _, v := range vnis {
		if v >= 1<<24 {
			return c, fmt.Errorf("VNI %d does not fit in 24 bits", v)
		}
	}
	if err := c.MFlow.check(cpus); err != nil {
		return c, err
	}
	switch {
	case !c.PrioIdleInline:
		c.InlineCPU = 0
	case !c.Prio || !c.CountSplit || c.MFlow.At != SplitOff:
		return c, errors.New("bulk inline while idle needs priority classes and split counting, without micro-flows")
	case len(cpus) == 1:
		c.InlineCPU = cpus[0]
	case !slices.Contains(cpus, c.InlineCPU):
		return c, fmt.Errorf("bulk inline while idle on core %d, which is not one of the cores %v", c.InlineCPU, cpus)
	}
	if c.PrioQuiet != 0 && (!c.PrioIdleInline || c.PrioQuiet < time.Millisecond || c.PrioQuiet > MaxPrioQuiet || c.PrioQuiet%time.Millisecond != 0) {
		return c, fmt.Errorf("quiet time %v: want whole milliseconds from 1ms to %v, with bulk inline while idle", c.PrioQuiet, MaxPrioQuiet)
	}
	if c.HighAutoPPS != 0 && !c.PrioIdleInline {
		return c, errors.New("high=auto's switch needs bulk inline while idle (its fast, in-order moves)")
	}
	if c.BulkQuiet != 0 && (c.HighAutoPPS == 0 || c.BulkQuiet < time.Millisecond || c.BulkQuiet > MaxPrioQuiet || c.BulkQuiet%time.Millisecond != 0) {
		return c, fmt.Errorf("bulk quiet time %v: want whole milliseconds from 1ms to %v, with high=auto", c.BulkQuiet, MaxPrioQuiet)
	}
	if c.BulkAuto != 0 && (c.HighAutoPPS == 0 || c.BulkAuto < time.Millisecond || c.BulkAuto > MaxPrioQuiet || c.BulkAuto%time.Millisecond != 0) {
		return c, fmt.Errorf("bulk auto time %v: want whole milliseconds from 1ms to %v, with high=auto", c.BulkAuto, MaxPrioQuiet)
	}
	if c.AsideBelow != 0 && (c.HighAutoPPS == 0 || c.BulkAuto == 0 || c.AsideBelow > 100) {
		return c, fmt.Errorf("aside below %d%%: want a percent from 1 to 100, with high=auto and bulk=auto", c.AsideBelow)
	}
	if c.AsideDepth != 0 && (c.AsideBelow == 0 || c.AsideDepth < 100 || c.AsideDepth > MaxAsideDepth) {
		return c, fmt.Errorf("aside depth %.2f frames per poll: want 1 to %d, with aside below", float64(c.AsideDepth)/100, MaxAsideDepth/100)
	}
	if c.VethClass && (!c.Prio || c.Sync) {
		return c, errors.New("per-class container queues need priority classes without sync")
	}
	if c.Fast != (c.FastIdle != 0) || c.FastIdle < 0 || c.FastIdle > MaxPrioQuiet || c.FastIdle%time.Millisecond != 0 {
		return c, fmt.Errorf("fast path idle timeout %v: want whole milliseconds from 1ms to %v, with the fast path on (and none without it)", c.FastIdle, MaxPrioQuiet)
	}
	if c.Fast && (c.MFlow.At != SplitOff || c.Sync) {
		// A micro-flow's frames must meet their reassembly on the
		// kernel's path, and sync's shortcut would be a second one.
		return c, errors.New("the fast path runs beside neither micro-flows nor PRISM-sync")
	}
	if c.FastBeside && !c.Fast {
		return c, errors.New("the fast path beside another mode needs the fast path")
	}
	if c.FastNoGSO && !c.Fast {
		return c, errors.New("leaving GSO frames to the kernel's path needs the fast path")
	}
	c.CPUs, c.VNIs = cpus, vnis
	return c, nil
}

// check validates m against the (sorted) core set.
func (m MFlow) check(cpus []int) error {
	switch {
	case m.At == SplitOff:
		return nil
	case m.At > SplitAtBridge:
		return fmt.Errorf("micro-flow split point %s: want irq or bridge", m.At)
	case m.Batch < 1 || m.Batch > MaxBatch:
		return fmt.Errorf("micro-flow batch %d: want 1..%d frames", m.Batch, MaxBatch)
	case len(m.Cores) == 0:
		return errors.New("micro-flows have no split cores")
	case m.Window <= 0:
		return fmt.Errorf("elephant window %v: must be positive", m.Window)
	case m.Quiet != 0 && (m.Quiet < time.Millisecond || m.Quiet > MaxMFlowQuiet):
		return fmt.Errorf("elephant quiet time %v: want 0 or 1ms..%v", m.Quiet, MaxMFlowQuiet)
	}
	for i, c := range m.Cores {
		if !slices.Contains(cpus, c) {
			return fmt.Errorf("split core %d is not among the config's cores %v", c, cpus)
		}
		if slices.Contains(m.Cores[:i], c) {
			return fmt.Errorf("split core %d listed twice", c)
		}
	}
	return nil
}
