//go:build linux

package steer

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Counters are one stage's event counts, summed over cores.
type Counters struct {
	Steered  uint64 // next stage sent to a chosen core
	Stayed   uint64 // vanilla placement (table or flow said Stay, or no cpumap entry)
	Passed   uint64 // frame not understood: passed untouched
	Held     uint64 // a move deferred to keep the flow in order
	Moved    uint64 // a flow moved at a flowlet boundary
	Disabled uint64 // packets seen while the config was disabled
	// Undrained is moves made after Config.Drain with frames still
	// counted in flight: each may have reordered if they were not dropped.
	Undrained uint64
	// High is frames of high-priority flows (split stage, Config.Prio).
	High uint64

	// MFLOW (Config.MFlow), at the stage that splits (split: SplitAtIRQ,
	// bridge: SplitAtBridge). MicroFrames are frames of elephants sent to
	// their micro-flow's core (GRO segments at the bridge); they are not
	// in Steered or Stayed.
	MicroFrames  uint64
	MicroFlows   uint64 // micro-flows started
	Elephants    uint64 // flows that became elephants
	ElephantsEnd uint64 // elephants that fell below the threshold
	// MicroArrived (split stage, SplitAtIRQ) is micro-flow frames whose
	// metadata tc ingress on the underlay read back, counted on the core
	// they arrived on (CoreStats); MicroLate is those of a micro-flow
	// older than one already seen there: batch-level reordering.
	MicroArrived uint64
	MicroLate    uint64

	// PRISM-sync (Config.Sync), split stage: Sync is high-priority frames
	// decapsulated and handed straight to their container's veth;
	// SyncMiss those that took the batch path for want of a vouched-for
	// destination (or because they were too long for it).
	Sync     uint64
	SyncMiss uint64
	// SyncRefused is high-priority frames with a destination that the
	// kernel's own path would not have delivered there (bpf/sync.h's
	// sync_accept: a wrong checksum or length, another host's address, an
	// unknown source, reserved VXLAN bits, outer CE on a Not-ECT packet):
	// they took the normal path, where the kernel decides. SyncExpired is
	// those whose destination's deadline had passed (no agent renewed it);
	// SyncDropped is frames the shortcut redirected that the devmap or
	// the veth then dropped (a full ring, a device going away).
	SyncRefused uint64
	SyncExpired uint64
	SyncDropped uint64

	// Aside (split stage) is frames PRISM's aside pass let through at
	// once while it stood aside with nothing queued on the receive core:
	// vanilla's path, not parsed, classified or tracked, so not in High,
	// Stayed or Passed either (bpf/prio.h's aside_pass).
	Aside uint64

	// Home is frames that took the stage's at-home fast path (SetHome):
	// vanilla placement without per-flow state; not in Stayed.
	Home uint64

	// Settled (split stage) is waits that ended because the flow's core's
	// queues were seen empty (Queues) while the flow still counted frames
	// in flight: those had been dropped (or their count lagged), and the
	// flow could move without waiting for the drain time.
	Settled uint64

	// Dropped (later stages) is frames counted in flight that the kernel
	// reported dropped before the next stage's program saw them (a full
	// RPS backlog, GRO cell or veth ring): counted out, so they no longer
	// hold their flow until the drain time (TrackQueues, steer_drops_skb).
	Dropped uint64

	// Direct (bridge stage) is frames that stayed without a pass through
	// the RPS backlog, as in vanilla (bpf/place.h's stay_direct); they count
	// in Stayed too or, at home, in Home.
	Direct uint64

	// BulkBeside (split stage) is bulk frames that PRISM's bulk=auto
	// (Config.BulkAuto) kept in the NIC poll beside busy marked flows;
	// they count in Stayed too.
	BulkBeside uint64

	// Unmarked (split stage) is frames sent to a core's queue without
	// lanes' metadata, for want of room (a driver or an earlier XDP
	// program left metadata that fills the frame's headroom): the
	// queue they went to is then untracked (Queue.Untracked), and moves
	// out of it wait for the drain time.
	Unmarked uint64

	// Remade is flow states made anew (the LRU had evicted the flow's)
	// whose slot still noted the old one: each started where the old
	// state's frames went, in another count epoch, so its frames queue
	// behind any of those still in flight (bpf/order.h's remake).
	Remade uint64

	// The fast path (Config.Fast), split stage: Fast is frames
	// decapsulated at the underlay's tc ingress and handed straight to
	// their container's namespace. The others are frames that took the
	// kernel's path, by reason: FastNoEntry, no entry for their flow (each
	// left a note to learn from); FastOther, another device, VTEP or MAC
	// than the entry's; FastRefused, a check of the kernel's path failed
	// (checksums, lengths, IP options, VXLAN flags, ECN, TTL, MTU);
	// FastGSO, a GSO frame; FastStale, a change on the path since the
	// entry was made (deleted); FastLease, the agent's lease past; FastIdle,
	// an entry idle past Config.FastIdle (deleted); FastEnded, TCP FIN or
	// RST (deleted). FastDropped is frames lost once decapsulation began.
	// FastAdmitted is entries made at a host-side veth's egress;
	// FastUnlearned is overlay frames leaving to a veth the agent vouches
	// for that made none (no matching note, another MAC, IP options, FIN or
	// RST). FastBehind is frames that took the kernel's path because
	// another of their flow was still on it (they would have overtaken it).
	Fast, FastNoEntry, FastOther, FastRefused, FastGSO, FastStale, FastLease, FastIdle, FastEnded, FastDropped uint64
	FastAdmitted, FastUnlearned, FastBehind                                                                    uint64

	// The fast path out of the container (Config.Fast), split stage:
	// FastOut is frames encapsulated at a host-side veth's tc ingress and
	// sent out the underlay. The misses are as the way in's, FastOutOther
	// being another MAC, TTL, TOS or DF than the learned packet's.
	// FastOutAdmitted is entries made at the underlay's egress;
	// FastOutUnlearned is noted packets leaving there that made none.
	FastOut, FastOutNoEntry, FastOutOther, FastOutRefused, FastOutStale, FastOutLease, FastOutIdle, FastOutEnded, FastOutDropped uint64
	FastOutAdmitted, FastOutUnlearned                                                                                            uint64
}

// fields lists c's counters in bpf/counters.h's enum counter order, which
// TestConstsMatchC checks (and their count, against steer_stats' size).
func (c *Counters) fields() []*uint64 {
	return []*uint64{&c.Steered, &c.Stayed, &c.Passed, &c.Held, &c.Moved, &c.Disabled, &c.Undrained, &c.High,
		&c.MicroFrames, &c.MicroFlows, &c.Elephants, &c.ElephantsEnd, &c.MicroArrived, &c.MicroLate, &c.Sync, &c.SyncMiss, &c.Home, &c.Settled, &c.Dropped, &c.Direct, &c.BulkBeside, &c.Unmarked, &c.SyncRefused, &c.SyncExpired, &c.SyncDropped, &c.Aside, &c.Remade,
		&c.Fast, &c.FastNoEntry, &c.FastOther, &c.FastRefused, &c.FastGSO, &c.FastStale, &c.FastLease, &c.FastIdle, &c.FastEnded, &c.FastDropped,
		&c.FastAdmitted, &c.FastUnlearned, &c.FastBehind,
		&c.FastOut, &c.FastOutNoEntry, &c.FastOutOther, &c.FastOutRefused, &c.FastOutStale, &c.FastOutLease, &c.FastOutIdle, &c.FastOutEnded, &c.FastOutDropped,
		&c.FastOutAdmitted, &c.FastOutUnlearned}
}

// Sub returns c minus earlier, counter by counter: what happened between
// two reads.
func (c Counters) Sub(earlier Counters) Counters {
	out := c
	o, e := out.fields(), earlier.fields()
	for i := range o {
		*o[i] -= *e[i]
	}
	return out
}

// Add returns c plus other, counter by counter.
func (c Counters) Add(other Counters) Counters {
	out := c
	o, e := out.fields(), other.fields()
	for i := range o {
		*o[i] += *e[i]
	}
	return out
}

// numCounters is bpf/counters.h's NUM_COUNTERS (TestConstsMatchC).
var numCounters = len((&Counters{}).fields())

// Stats reads every stage's counters, summed over cores.
func (d *Datapath) Stats() ([NumStages]Counters, error) {
	var out [NumStages]Counters
	per, err := d.CoreStats()
	for _, core := range per {
		for stage := range core {
			dst, src := out[stage].fields(), core[stage].fields()
			for i := range dst {
				*dst[i] += *src[i]
			}
		}
	}
	return out, err
}

// CoreStats reads every stage's counters per core (index: core number),
// as counted on the core each program ran on, in one syscall.
func (d *Datapath) CoreStats() ([][NumStages]Counters, error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("counting possible CPUs: %w", err)
	}
	n := NumStages * numCounters
	keys := make([]uint32, n)
	per := make([]uint64, n*ncpu)
	if err := readAll(d.objs.SteerStats, keys, per, "counters"); err != nil {
		return nil, err
	}
	out := make([][NumStages]Counters, ncpu)
	for i, k := range keys {
		stage, c := int(k)/numCounters, int(k)%numCounters
		if stage >= NumStages {
			return nil, fmt.Errorf("reading counters: key %d past the last stage", k)
		}
		for cpu := range out {
			*out[cpu][stage].fields()[c] = per[i*ncpu+cpu]
		}
	}
	return out, nil
}

// readAll reads every entry of the array m (keys sized for all of them,
// vals for their values) in one batch lookup.
func readAll(m *ebpf.Map, keys []uint32, vals any, what string) error {
	var cur ebpf.MapBatchCursor
	n, err := m.BatchLookup(&cur, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	if n != len(keys) {
		return fmt.Errorf("reading %s: %d of %d entries", what, n, len(keys))
	}
	return nil
}
