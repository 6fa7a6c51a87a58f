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

// steer_cfg.flags bits: the runtime switches (the mode's are in mode.go).
const (
	cfgEnabled  = 1
	cfgHome     = 0x80   // << stage: the stage is at home (SetHome)
	cfgHomeBare = 0x2000 // the bridge stage's bare path at home (SetHomeBare)
)

// classHi is the bit of a flow's cpu_idx that says it uses the core's
// high-priority queue (bpf/consts.h's CLASS_HI); syncIdx is the cpu_idx of a
// flow on PRISM-sync's shortcut (SYNC_IDX).
const (
	classHi = 0x40000000
	syncIdx = 0x20000000
)

// stayFresh, stayQueued and stayDirect are bpf/consts.h's STAY_FRESH,
// STAY_QUEUED and STAY_DIRECT: a bridge-stage flow that has to queue a
// counted frame before it may run on, one queuing counted (at the
// container stage: on the core in stay_cpu, stay_core), and one staying
// without the RPS backlog.
const (
	stayFresh  = 0
	stayQueued = 1
	stayDirect = 2
	stayMode   = 3
)

// SetConfig validates c and makes the programs use it. CPUs are stored
// ascending; the VNI set replaces the previous one. A config of another
// mode than the programs were loaded for has them loaded again for it
// (setMode), which only a datapath this process loaded can do.
//
// The write is not atomic for a packet being placed at that moment: one
// packet may see the old core set with the new count. It can be placed on
// a wrong core, never dropped.
func (d *Datapath) SetConfig(c Config) error {
	c, err := c.normalized()
	if err != nil {
		return err
	}
	was := d.mode
	if err := d.setMode(modeOf(c)); err != nil {
		return err
	}
	var old []uint32
	var vni uint32
	var one uint8
	it := d.objs.SteerVni.Iterate()
	for it.Next(&vni, &one) {
		old = append(old, vni)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading VNIs: %w", err)
	}
	for _, v := range c.VNIs {
		if err := d.objs.SteerVni.Put(v, uint8(1)); err != nil {
			return fmt.Errorf("adding VNI %d: %w", v, err)
		}
	}
	k := encodeConfig(c)
	// Frames hashed for the core set before a change may still be queued:
	// the programs decode their hashes with the previous set (bpf/flow.h,
	// hash_of_count), so their counts still drain.
	var cur steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &cur); err != nil {
		return fmt.Errorf("reading steer config: %w", err)
	}
	// A new config starts with every stage off home: restart the states
	// of those at home first, as SetHome does.
	for st := range NumStages {
		if cur.Flags&(uint32(cfgHome)<<st) != 0 {
			if err := d.leavingHome(st); err != nil {
				return err
			}
		}
	}
	// The ranges depend on the number of cores alone.
	if cur.Ncpus != 0 && cur.Ncpus != k.Ncpus {
		k.PrevNcpus, k.PrevSpan, k.PrevRpsLo = cur.Ncpus, cur.RpsSpan, cur.RpsLo
	} else {
		k.PrevNcpus, k.PrevSpan, k.PrevRpsLo = cur.PrevNcpus, cur.PrevSpan, cur.PrevRpsLo
	}
	if k.MetaGen, err = d.metaGen(); err != nil {
		return err
	}
	// A new config starts with every rule's flows in the high-priority
	// queue, as the plan says; the agent switches them from there.
	if err := d.clearHighInline(); err != nil {
		return err
	}
	// Bulk frames are stamped only while bulk quiet is on: a stamp left
	// from before it was off would date the last bulk frame wrongly.
	if d.mode.BulkQuietMs != 0 && was.BulkQuietMs == 0 {
		if err := d.objs.SteerBulkSeen.Put(uint32(0), uint64(0)); err != nil {
			return fmt.Errorf("resetting the last bulk frame's time: %w", err)
		}
	}
	// The same for bulk=auto's two clocks, and on every new config with
	// it: the switches were just cleared, so a busy stamp from before
	// would send bulk into the NIC poll beside no busy rule.
	if d.mode.BulkAutoMs != 0 {
		if err := d.objs.SteerHighSeen.Put(uint32(0), steerHighSeen{}); err != nil {
			return fmt.Errorf("resetting the last high-priority frames' times: %w", err)
		}
	}
	if err := d.objs.SteerCfg.Put(uint32(0), k); err != nil {
		return fmt.Errorf("writing steer config: %w", err)
	}
	for _, v := range old {
		if slices.Contains(c.VNIs, v) {
			continue
		}
		if err := d.objs.SteerVni.Delete(v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("removing VNI %d: %w", v, err)
		}
	}
	return nil
}

func encodeConfig(c Config) steerSteerCfg {
	n := len(c.CPUs)
	k := steerSteerCfg{
		Ncpus:       uint32(n),
		FlowletNs:   uint64(c.Flowlet),
		DrainNs:     uint64(c.Drain),
		VxlanPort:   uint32(c.VXLANPort),
		CoarseLagNs: coarseLag(),
	}
	if c.Enabled {
		k.Flags |= cfgEnabled
	}
	for i := range k.IndexOf {
		k.IndexOf[i] = Stay
	}
	for i, cpu := range c.CPUs {
		k.Cpus[i] = uint32(cpu)
		k.RpsLo[i], k.RpsSpan = rpsRange(i, n)
		k.IndexOf[cpu] = uint32(i)
	}
	if m := c.MFlow; m.At != SplitOff {
		k.MfWindowNs = uint64(m.Window)
		k.MfThresh = m.Threshold
		k.MfBatch = m.Batch
		k.MfNcores = uint32(len(m.Cores))
		for i, cpu := range m.Cores {
			k.MfCores[i] = k.IndexOf[cpu]
		}
	}
	return k
}

// decodeMFlow reads MFlow back from the programs' config and mode flags.
func decodeMFlow(k *steerSteerCfg, flags uint32) MFlow {
	var m MFlow
	for at, flag := range mflowFlag {
		if flags&flag != 0 {
			m.At = at
		}
	}
	if m.At == SplitOff {
		return m
	}
	m.Batch, m.Threshold, m.Window = k.MfBatch, k.MfThresh, time.Duration(k.MfWindowNs)
	for _, idx := range k.MfCores[:min(k.MfNcores, MaxCPUs)] {
		if idx < min(k.Ncpus, MaxCPUs) {
			m.Cores = append(m.Cores, int(k.Cpus[idx]))
		}
	}
	return m
}

// Config reads back the config the programs use.
func (d *Datapath) Config() (Config, error) {
	c, err := d.configOnly()
	if err != nil {
		return c, err
	}
	var vni uint32
	var one uint8
	it := d.objs.SteerVni.Iterate()
	for it.Next(&vni, &one) {
		c.VNIs = append(c.VNIs, vni)
	}
	if err := it.Err(); err != nil {
		return Config{}, fmt.Errorf("reading VNIs: %w", err)
	}
	slices.Sort(c.VNIs)
	return c, nil
}

// configOnly reads the config map alone: Config without its VNIs.
func (d *Datapath) configOnly() (Config, error) {
	var k steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &k); err != nil {
		return Config{}, fmt.Errorf("reading steer config: %w", err)
	}
	m := d.mode
	c := Config{
		Enabled:        k.Flags&cfgEnabled != 0,
		Prio:           m.Flags&modePrio != 0,
		CountSplit:     m.Flags&modeCountSplit != 0,
		NoBridgeCount:  m.Flags&modeNoBridgeCount != 0,
		StayQueued:     m.Flags&modeStayQueued != 0,
		Sync:           m.Flags&modeSync != 0,
		PrioIdleInline: m.Flags&modePrioIdleInline != 0,
		VethClass:      m.Flags&modeVethClass != 0,
		PrioQuiet:      time.Duration(m.PrioQuietMs) * time.Millisecond,
		HighAutoPPS:    m.HighAutoPps,
		BulkQuiet:      time.Duration(m.BulkQuietMs) * time.Millisecond,
		BulkAuto:       time.Duration(m.BulkAutoMs) * time.Millisecond,
		Flowlet:        time.Duration(k.FlowletNs),
		Drain:          time.Duration(k.DrainNs),
		VXLANPort:      uint16(k.VxlanPort),
		MFlow:          decodeMFlow(&k, m.Flags),
	}
	for _, cpu := range k.Cpus[:min(k.Ncpus, MaxCPUs)] {
		c.CPUs = append(c.CPUs, int(cpu))
	}
	return c, nil
}

// SetCPUMapEntry lets steer_xdp redirect to cpu, with a queue of qsize
// frames. The kernel starts a cpumap/<cpu> kthread for it, which runs the
// split stage's share of the receive path.
func (d *Datapath) SetCPUMapEntry(cpu int, qsize uint32) error {
	return putCPUMap(d.objs.SteerCpumap, "cpumap", cpu, qsize)
}

// DelCPUMapEntry removes cpu's cpumap entry; frames placed there then stay
// on the core that received them. Removing a missing entry is not an error.
func (d *Datapath) DelCPUMapEntry(cpu int) error {
	return delCPUMap(d.objs.SteerCpumap, "cpumap", cpu)
}

// CPUMapEntries lists the cores that have a cpumap entry, ascending.
func (d *Datapath) CPUMapEntries() ([]int, error) {
	return cpuMapEntries(d.objs.SteerCpumap, "cpumap")
}

// SetHiCPUMapEntry gives cpu a high-priority queue of qsize frames (its own
// kthread) for flows the priority rules match, when Config.Prio is on.
// Without one, high-priority frames for that core are not redirected: they
// take the vanilla path on the core that received them.
func (d *Datapath) SetHiCPUMapEntry(cpu int, qsize uint32) error {
	return putCPUMap(d.objs.SteerCpumapHi, "high-priority cpumap", cpu, qsize)
}

// DelHiCPUMapEntry removes cpu's high-priority queue.
func (d *Datapath) DelHiCPUMapEntry(cpu int) error {
	return delCPUMap(d.objs.SteerCpumapHi, "high-priority cpumap", cpu)
}

// HiCPUMapEntries lists the cores that have a high-priority queue.
func (d *Datapath) HiCPUMapEntries() ([]int, error) {
	return cpuMapEntries(d.objs.SteerCpumapHi, "high-priority cpumap")
}

func putCPUMap(m *ebpf.Map, what string, cpu int, qsize uint32) error {
	if cpu < 0 || cpu >= MaxCPUs {
		return fmt.Errorf("%s entry for core %d: must be 0..%d", what, cpu, MaxCPUs-1)
	}
	if qsize == 0 {
		// The kernel takes qsize 0 as a delete.
		return fmt.Errorf("%s entry for core %d: queue size 0", what, cpu)
	}
	if err := m.Put(uint32(cpu), steerBpfCpumapVal{Qsize: qsize}); err != nil {
		return fmt.Errorf("%s entry for core %d: %w", what, cpu, err)
	}
	return nil
}

func delCPUMap(m *ebpf.Map, what string, cpu int) error {
	if cpu < 0 || cpu >= MaxCPUs {
		return fmt.Errorf("%s entry for core %d: must be 0..%d", what, cpu, MaxCPUs-1)
	}
	if err := m.Delete(uint32(cpu)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("removing %s entry for core %d: %w", what, cpu, err)
	}
	return nil
}

func cpuMapEntries(m *ebpf.Map, what string) ([]int, error) {
	var cpus []int
	var v steerBpfCpumapVal
	for cpu := range MaxCPUs {
		err := m.Lookup(uint32(cpu), &v)
		switch {
		case err == nil:
			cpus = append(cpus, cpu)
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return nil, fmt.Errorf("reading %s entry for core %d: %w", what, cpu, err)
		}
	}
	return cpus, nil
}

func checkStage(stage int) error {
	if stage < 0 || stage >= NumStages {
		return fmt.Errorf("stage %d: must be 0..%d", stage, NumStages-1)
	}
	return nil
}

func checkIndex(idx uint32) error {
	if idx != Stay && idx >= MaxCPUs {
		return fmt.Errorf("core index %d: must be 0..%d or Stay", idx, MaxCPUs-1)
	}
	return nil
}

// SetTable writes a stage's whole table: bucket b's flows go to
// Config.CPUs[t[b]] (or stay, for Stay). An index beyond the configured
// cores acts as Stay.
func (d *Datapath) SetTable(stage int, t [Buckets]uint32) error {
	if err := checkStage(stage); err != nil {
		return err
	}
	keys := make([]uint32, Buckets)
	for b, idx := range t {
		if err := checkIndex(idx); err != nil {
			return fmt.Errorf("bucket %d: %w", b, err)
		}
		keys[b] = uint32(stage*Buckets + b)
	}
	// One syscall, so the table changes as nearly at once as it can.
	if _, err := d.objs.SteerTable.BatchUpdate(keys, t[:], nil); err != nil {
		return fmt.Errorf("writing %s table: %w", StageName(stage), err)
	}
	return nil
}

// Tables reads every stage's table in one syscall (an array's batch
// lookup walks it from index 0).
func (d *Datapath) Tables() ([NumStages][Buckets]uint32, error) {
	var t [NumStages][Buckets]uint32
	keys := make([]uint32, NumStages*Buckets)
	vals := make([]uint32, NumStages*Buckets)
	var cur ebpf.MapBatchCursor
	n, err := d.objs.SteerTable.BatchLookup(&cur, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return t, fmt.Errorf("reading the placement tables: %w", err)
	}
	if n != len(keys) {
		return t, fmt.Errorf("reading the placement tables: %d of %d entries", n, len(keys))
	}
	for i, k := range keys {
		t[k/Buckets][k%Buckets] = vals[i]
	}
	return t, nil
}

// Table reads a stage's table.
func (d *Datapath) Table(stage int) ([Buckets]uint32, error) {
	if err := checkStage(stage); err != nil {
		return [Buckets]uint32{}, err
	}
	t, err := d.Tables()
	return t[stage], err
}

// SetBucket points one bucket of a stage's table at a core index (or Stay).
func (d *Datapath) SetBucket(stage, bucket int, idx uint32) error {
	if err := checkStage(stage); err != nil {
		return err
	}
	if bucket < 0 || bucket >= Buckets {
		return fmt.Errorf("bucket %d: must be 0..%d", bucket, Buckets-1)
	}
	if err := checkIndex(idx); err != nil {
		return err
	}
	if err := d.objs.SteerTable.Put(uint32(stage*Buckets+bucket), idx); err != nil {
		return fmt.Errorf("writing %s table bucket %d: %w", StageName(stage), bucket, err)
	}
	return nil
}

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

// MicroFlowState is one flow's MFLOW state (Config.MFlow): the split stage
// keeps it for SplitAtIRQ, the bridge stage for SplitAtBridge.
type MicroFlowState struct {
	// Elephant: the flow is being split.
	Elephant bool
	// Started is the number of micro-flows started; the current one's
	// sequence number is Started-1.
	Started uint32
	// CPUIndex is the index into Config.CPUs of the current micro-flow.
	CPUIndex uint32
	// Frames is how many frames were sent as micro-flows.
	Frames uint64
	// Seen is the highest sequence number whose frames the skb side (tc
	// ingress on the underlay) read back from their metadata, valid when
	// SeenAny (split stage only).
	Seen    uint32
	SeenAny bool
}

// mfSeen is bpf/mflow.h's MF_SEEN: the flow's mf_seen holds a sequence number.
const mfSeen = 1 << 32

func microFlowState(s *steerSteerFlowState) MicroFlowState {
	return MicroFlowState{
		Elephant: s.MfElephant != 0,
		Started:  s.MfStarted,
		CPUIndex: s.MfCore,
		Frames:   s.MfFrames,
		Seen:     uint32(s.MfSeen),
		SeenAny:  s.MfSeen&mfSeen != 0,
	}
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

// Activity is what a balancer needs of the flow map each round, from one
// walk of it, without building a Flow per entry.
type Activity struct {
	// Active marks, per stage, the table buckets whose flows saw a packet
	// within the window; Flows counts those (flow, stage) pairs.
	Active [NumStages][Buckets]bool
	Flows  int
	// Packets sums, per stage and bucket, the packet counts of every flow
	// in the map, active or not (each counted since its state was made):
	// a balancer that keeps the previous sum gets a bucket's rate. The sum
	// falls when a flow's state is evicted or deleted.
	Packets [NumStages][Buckets]uint64
	// Away is set for a stage if an active flow's stage runs away from
	// where the kernel runs it: the stage is not at home yet. At the
	// bridge stage a flow that stays through the RPS backlog with frames
	// counted in flight counts as away too, where that stage runs flows
	// on: at home the fast path runs on a flow it has no state for, and
	// the state could go (evicted) while those frames are queued. A
	// flow without frames in flight that has not run on yet keeps queuing
	// at home, uncounted, behind its own (Flow.Direct). A flow idle
	// for longer than the window does not count: whatever it queued was
	// seen long ago (or dropped, past any drain bound), so its next frame
	// may run at home. Counting it kept a stage away for ever once the
	// flow that had moved it ended.
	Away [NumStages]bool
	// Held is, per stage, the cores holding an active staying flow's
	// frames in flight (a bit per core; container stage: Flow.StayCore).
	// Where such a core is not the one the stage runs on at home, the
	// stage is not ready for home either: on the at-home fast path the
	// flow's next frames would queue on the home core past them.
	Held [NumStages]uint64
	// Cores is, per stage, the cores (a bit per index into Config.CPUs)
	// active flows are placed on by index, either class; flows that stay,
	// or take PRISM-sync's shortcut, are not in it.
	Cores [NumStages]uint64
}

// Activity walks the flow map once; window is how recent a packet makes a
// (flow, stage) active.
func (d *Datapath) Activity(window time.Duration) (Activity, error) {
	var a Activity
	direct := d.mode.Flags&directOff == 0
	now := uint64(Now())
	err := d.eachFlow(func(k *steerSteerFlowKey, s *steerSteerFlowState) {
		if int(k.Stage) >= NumStages {
			return
		}
		a.Packets[k.Stage][s.Bucket%Buckets] += s.Packets
		// A flow stamped after now was read, during the walk, is a busy
		// one: the subtraction would wrap and call it idle.
		if s.LastNs < now && now-s.LastNs > uint64(window) {
			return
		}
		if s.CpuIdx != Stay || (direct && int(k.Stage) == StageBridge && s.Stay&stayMode != stayDirect && s.Inflight > 0) {
			a.Away[k.Stage] = true
		}
		if c := stayCore(k, s); c >= 0 && c < 64 && s.Inflight > 0 {
			a.Held[k.Stage] |= 1 << c
		}
		if i := cpuIndex(s.CpuIdx); i != Stay && i < 64 {
			a.Cores[k.Stage] |= 1 << i
		}
		a.Active[k.Stage][s.Bucket%Buckets] = true
		a.Flows++
	})
	return a, err
}

// Home reports which stages are at home (SetHome).
func (d *Datapath) Home() ([NumStages]bool, error) {
	var out [NumStages]bool
	var k steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &k); err != nil {
		return out, fmt.Errorf("reading steer config: %w", err)
	}
	for st := range out {
		out[st] = k.Flags&(cfgHome<<st) != 0
	}
	return out, nil
}

// SetHome switches a stage's at-home fast path: while on, the stage's
// program keeps vanilla placement without per-flow state, which costs a
// fraction of the full path. It is runtime state of the balancer, not part
// of Config (SetConfig clears it):
//
//   - Switch it on only while the stage's table is all Stay and Activity
//     says no flow's stage runs elsewhere (not Away): on the fast path
//     nothing moves.
//   - Switching it off first restarts the stage's flow states
//     (leavingHome): the states left from before count nothing the fast
//     path queued. The frames queued at home are ahead, in the same
//     per-core FIFO queues, of the first frames counted afresh, so a move
//     that waits for those waits for them too.
//
// The write replaces the whole config entry with what was read plus the
// bit; lanes agent is its only runtime writer.
func (d *Datapath) SetHome(stage int, on bool) error {
	if err := checkStage(stage); err != nil {
		return err
	}
	var k steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &k); err != nil {
		return fmt.Errorf("reading steer config: %w", err)
	}
	bit := uint32(cfgHome) << stage
	if on {
		k.Flags |= bit
	} else {
		if k.Flags&bit != 0 {
			if err := d.leavingHome(stage); err != nil {
				return err
			}
		}
		k.Flags &^= bit
		if stage == StageBridge {
			k.Flags &^= cfgHomeBare
		}
	}
	if err := d.objs.SteerCfg.Put(uint32(0), k); err != nil {
		return fmt.Errorf("writing steer config: %w", err)
	}
	return nil
}

// HighInline lists the rules whose flows run their first stage in the NIC
// poll now (SetHighInline), empty unless the config has high=auto
// (Config.HighAutoPPS), without which the programs ignore the switches.
func (d *Datapath) HighInline() ([]Rule, error) {
	_, on, err := d.HighAuto()
	return on, err
}

// HighAuto reads high=auto's threshold from the config (0: off) and the
// rules whose flows run in the NIC poll now (HighInline).
func (d *Datapath) HighAuto() (pps uint32, inline []Rule, err error) {
	pps = d.mode.HighAutoPps
	on, err := d.highSwitches()
	if err != nil || pps == 0 {
		return pps, nil, err
	}
	return pps, on, nil
}

// highSwitches reads steer_high_inline alone: the rules SetHighInline
// turned on (heeded only under a config with high=auto), in Rules' order.
func (d *Datapath) highSwitches() ([]Rule, error) {
	return rulesIn(d.objs.SteerHighInline, "the high-priority switches", func(on uint32) bool { return on != 0 })
}

// SetHighInline switches where the flows rule r marks run their first
// stage: on, in the NIC poll that classified them (PRISM's high=inline);
// off, in the receive core's high-priority queue (high=queue). It is
// runtime state of PRISM's high=auto (lanes agent), in a map of its own,
// so that writing it never rewrites what lanes prio and apply write; the
// programs heed it only while the config has Config.HighAutoPPS, which
// needs Config.PrioIdleInline: there steer_xdp moves each flow between the
// queue and the NIC poll as soon as none of its frames is left on the old
// path (place()'s PLACE_LOCAL), so the switch never reorders a flow;
// without it a busy flow would wait for an idle gap. A flow marked by
// several rules goes by the first that steer_xdp finds (MarkingRule).
// Switching on is refused without high=auto in the config; off always
// works.
func (d *Datapath) SetHighInline(r Rule, on bool) error {
	if err := r.check(); err != nil {
		return err
	}
	if !on {
		if err := d.objs.SteerHighInline.Delete(r.key()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clearing the high-priority switch of %s: %w", r, err)
		}
		return nil
	}
	if d.mode.HighAutoPps == 0 {
		return errors.New("high-priority flows switch to the NIC poll only under high=auto (Config.HighAutoPPS), which the applied config does not have")
	}
	if err := d.objs.SteerHighInline.Put(r.key(), uint32(1)); err != nil {
		return fmt.Errorf("writing the high-priority switch of %s: %w", r, err)
	}
	// A rule deleted meanwhile (lanes prio del drops its switch, maybe
	// just before this Put) must not keep one: added again, it would
	// start inline.
	var one uint8
	if err := d.objs.SteerPrio.Lookup(r.key(), &one); errors.Is(err, ebpf.ErrKeyNotExist) {
		if err := d.SetHighInline(r, false); err != nil {
			return err
		}
		return fmt.Errorf("priority rule %s: deleted while its high-priority switch was set", r)
	}
	return nil
}

// clearHighInline puts every rule's flows back in the high-priority queue.
func (d *Datapath) clearHighInline() error {
	on, err := d.highSwitches()
	if err != nil {
		return err
	}
	for _, r := range on {
		if err := d.SetHighInline(r, false); err != nil {
			return err
		}
	}
	return nil
}

// ForgetHigh drops what high=auto keeps for rule r (its switch and its
// frame count), for a rule that is gone.
func (d *Datapath) ForgetHigh(r Rule) error {
	if err := d.SetHighInline(r, false); err != nil {
		return err
	}
	if err := d.objs.SteerHighFrames.Delete(r.key()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("dropping the frame count of %s: %w", r, err)
	}
	return nil
}

// HighRuleFrames is the number of frames each rule marked, summed over
// cores, counted by steer_xdp only while the config has high=auto: lanes
// agent's rate of each rule. A rule appears with its first frame.
func (d *Datapath) HighRuleFrames() (map[Rule]uint64, error) {
	out := map[Rule]uint64{}
	var (
		k   steerPrioRule
		per []uint64
	)
	it := d.objs.SteerHighFrames.Iterate()
	for it.Next(&k, &per) {
		var n uint64
		for _, v := range per {
			n += v
		}
		out[ruleOf(k)] = n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the high-priority frame counts: %w", err)
	}
	return out, nil
}

// HomeBare reports whether the bridge stage at home runs every frame on
// without looking its flow up (SetHomeBare).
func (d *Datapath) HomeBare() (bool, error) {
	var k steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &k); err != nil {
		return false, fmt.Errorf("reading steer config: %w", err)
	}
	return k.Flags&cfgHomeBare != 0 && k.Flags&(cfgHome<<StageBridge) != 0, nil
}

// SetHomeBare switches the bridge stage's bare path at home on: every
// overlay frame runs on through the GRO cell's poll without a flow lookup
// (bpf/tc.c's steer_tc; frames it does not understand still pass
// untouched). Switch it on only while the stage is at home and
// HomeQueues says no flow there would queue; SetHome(StageBridge, false)
// switches it off with home.
func (d *Datapath) SetHomeBare() error {
	var k steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &k); err != nil {
		return fmt.Errorf("reading steer config: %w", err)
	}
	if k.Flags&(cfgHome<<StageBridge) == 0 {
		return errors.New("the bridge stage's bare path needs the stage at home")
	}
	k.Flags |= cfgHomeBare
	if err := d.objs.SteerCfg.Put(uint32(0), k); err != nil {
		return fmt.Errorf("writing steer config: %w", err)
	}
	return nil
}

// HomeQueues reports whether a flow at the bridge stage at home would
// queue through the RPS backlog rather than run on: its state does not run
// on, on core home, and it saw a frame within the drain time (the careful
// path at home stamps such a flow each frame, and runs on one idle for
// longer, its queued frames presumed out; bpf/place.h's home_idle). Until it
// says no, the bare path would let such a flow's next frames overtake
// those it queued. Always yes without a drain time (no presumption).
func (d *Datapath) HomeQueues(home int) (bool, error) {
	var cfg steerSteerCfg
	if err := d.objs.SteerCfg.Lookup(uint32(0), &cfg); err != nil {
		return true, fmt.Errorf("reading steer config: %w", err)
	}
	if cfg.DrainNs == 0 {
		return true, nil
	}
	now := uint64(Now())
	queues := false
	err := d.eachFlow(func(k *steerSteerFlowKey, s *steerSteerFlowState) {
		if int(k.Stage) != StageBridge || queues {
			return
		}
		if s.CpuIdx == Stay && s.Stay&stayMode == stayDirect && int(s.StayCpu) == home {
			return
		}
		// A coarse stamp may be up to the coarse lag early (bpf/flow.h's
		// now_ns): count the lag as activity, never as idleness.
		if s.LastNs >= now || now-s.LastNs < cfg.DrainNs+cfg.CoarseLagNs {
			queues = true
		}
	})
	return queues, err
}

// leavingHome restarts a stage's flow states while the stage is still at
// home, where its program only reads them (the bridge stage) or ignores
// them: nothing the fast path queued was counted.
//
// Most stages' states are deleted. The bridge stage's are kept with a
// fresh count (a new epoch, so marked frames from before home do not
// lower it) where that stage runs flows on: at home it runs a flow on
// without the RPS backlog only if it has no state or one that ran on
// already (bpf/place.h's stay_direct), and queues the others' frames,
// uncounted. Deleting the state of a flow whose frames are so queued
// would let its next frame, at home still or just after, run on past
// them; kept and set back to STAY_FRESH, the flow queues its next frame
// counted and runs on only once that one is seen, behind them (and so
// behind what it ran on at home, uncounted, which a fresh state does not
// count out). Where nothing runs on (MFLOW: its programs also write
// states at home) they are deleted, as before running on existed.
func (d *Datapath) leavingHome(stage int) error {
	if stage != StageBridge || d.mode.Flags&directOff != 0 {
		return d.DeleteStageFlows(stage)
	}
	type entry struct {
		k steerSteerFlowKey
		v steerSteerFlowState
	}
	var todo []entry
	if err := d.eachFlow(func(k *steerSteerFlowKey, v *steerSteerFlowState) {
		if int(k.Stage) == stage {
			todo = append(todo, entry{*k, *v})
		}
	}); err != nil {
		return err
	}
	for _, e := range todo {
		v := e.v
		v.Inflight = 0
		v.Epoch = d.nextEpoch(&e.k, v.Epoch)
		v.Stay = stayFresh
		// Exist only: an entry evicted meanwhile stays gone, and the
		// fast path runs that flow on as one without state.
		if err := d.objs.SteerFlows.Update(&e.k, &v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("restarting a flow state: %w", err)
		}
	}
	return nil
}

// epochSlots is bpf/maps.h's EPOCH_SLOTS.
const epochSlots = 65536

// nextEpoch hands out the next count epoch of k's slot other than cur,
// as bpf/flow.h's next_epoch_after does (with the same race, and the same
// harmlessness).
func (d *Datapath) nextEpoch(k *steerSteerFlowKey, cur uint32) uint32 {
	fh := FlowHash(addrOf(k.Saddr), addrOf(k.Daddr), htons16(k.Sport), htons16(k.Dport), k.Proto)
	slot := uint32(k.Stage)*epochSlots + fh%epochSlots
	var n uint32
	if err := d.objs.SteerEpochs.Lookup(slot, &n); err != nil {
		return (cur + 1) % HashEpochs
	}
	if n%HashEpochs == cur {
		n++
	}
	_ = d.objs.SteerEpochs.Put(slot, n+1)
	return n % HashEpochs
}

// htons16 turns a __be16 field as Go reads it into the number it holds.
func htons16(v uint16) uint16 { return v>>8 | v<<8 }

// DeleteStageFlows removes every flow state of a stage.
func (d *Datapath) DeleteStageFlows(stage int) error {
	var keys []steerSteerFlowKey
	if err := d.eachFlow(func(k *steerSteerFlowKey, _ *steerSteerFlowState) {
		if int(k.Stage) == stage {
			keys = append(keys, *k)
		}
	}); err != nil {
		return err
	}
	for i := range keys {
		if err := d.objs.SteerFlows.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting a flow state: %w", err)
		}
	}
	return nil
}

// flowChunk is how many flows one batch syscall reads.
const flowChunk = 1024

// eachFlow calls fn for every entry of steer_flows, reading the map in
// batches: a handful of syscalls for thousands of flows where iterating
// takes two per entry. Entries the programs add or evict meanwhile may be
// missed or seen twice, as with any walk of a live hash map.
func (d *Datapath) eachFlow(fn func(*steerSteerFlowKey, *steerSteerFlowState)) error {
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
}

// fields lists c's counters in bpf/counters.h's enum counter order.
func (c *Counters) fields() []*uint64 {
	return []*uint64{&c.Steered, &c.Stayed, &c.Passed, &c.Held, &c.Moved, &c.Disabled, &c.Undrained, &c.High,
		&c.MicroFrames, &c.MicroFlows, &c.Elephants, &c.ElephantsEnd, &c.MicroArrived, &c.MicroLate, &c.Sync, &c.SyncMiss, &c.Home, &c.Settled, &c.Dropped, &c.Direct, &c.BulkBeside, &c.Unmarked, &c.SyncRefused, &c.SyncExpired, &c.SyncDropped}
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

// numCounters is bpf/counters.h's NUM_COUNTERS.
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
// as counted on the core each program ran on.
func (d *Datapath) CoreStats() ([][NumStages]Counters, error) {
	var out [][NumStages]Counters
	var per []uint64
	for stage := range NumStages {
		for i := range numCounters {
			if err := d.objs.SteerStats.Lookup(uint32(stage*numCounters+i), &per); err != nil {
				return nil, fmt.Errorf("reading %s counters: %w", StageName(stage), err)
			}
			if out == nil {
				out = make([][NumStages]Counters, len(per))
			}
			for cpu, v := range per {
				*out[cpu][stage].fields()[i] = v
			}
		}
	}
	return out, nil
}

// MicroFlowsPerCore reads how many micro-flows (Config.MFlow) were sent to
// each core (index: core number).
func (d *Datapath) MicroFlowsPerCore() ([MaxCPUs]uint64, error) {
	var out [MaxCPUs]uint64
	keys := make([]uint32, MaxCPUs)
	vals := make([]uint64, MaxCPUs)
	var cur ebpf.MapBatchCursor
	n, err := d.objs.SteerMfCores.BatchLookup(&cur, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return out, fmt.Errorf("reading micro-flows per core: %w", err)
	}
	if n != MaxCPUs {
		return out, fmt.Errorf("reading micro-flows per core: %d of %d entries", n, MaxCPUs)
	}
	for i, k := range keys {
		out[k%MaxCPUs] = vals[i]
	}
	return out, nil
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

// Queue is one core's split-stage queue accounting (bpf/maps.h, struct
// steer_queue): the frames steer_xdp marked for the core's cpumap queues
// (both classes) and, under prism's PLACE_LOCAL, for its NIC poll, and
// where they went.
type Queue struct {
	Core int `json:"core"`
	// Enqueued frames, of which the skb side saw Seen; DroppedRing were
	// refused by a full ring, DroppedKthread dropped by a kthread before
	// an skb existed, Lost booked lost by lanes agent (BookLost).
	// Enqueued minus the four is what is queued now (Queued).
	Enqueued       uint64 `json:"enqueued"`
	Seen           uint64 `json:"seen"`
	DroppedRing    uint64 `json:"dropped_ring"`
	DroppedKthread uint64 `json:"dropped_kthread"`
	Lost           uint64 `json:"lost,omitempty"`
	// Untracked: a frame went in that could not be marked, so the queues
	// can no longer be told empty and their flows fall back to the drain
	// time.
	Untracked bool `json:"untracked,omitempty"`
}

// Dropped is every frame the kernel reported dropped in the queues.
func (q Queue) Dropped() uint64 { return q.DroppedRing + q.DroppedKthread }

// Out is every frame that left: seen, dropped or booked lost.
func (q Queue) Out() uint64 { return q.Seen + q.Dropped() + q.Lost }

// Queued is what is in the queues now, or on its way from a kthread to
// the skb side's count (GRO).
func (q Queue) Queued() uint64 {
	if out := q.Out(); out < q.Enqueued {
		return q.Enqueued - out
	}
	return 0
}

// Queues reads the accounting of every core whose queues ever took a
// frame, by core; and whether the drop tracepoints are attached
// (TrackQueues), without which no queue is tracked.
func (d *Datapath) Queues() ([]Queue, bool, error) {
	var out []Queue
	var v steerSteerQueue
	for core := uint32(0); core < MaxCPUs; core++ {
		if err := d.objs.SteerQueues.Lookup(core, &v); err != nil {
			return nil, false, fmt.Errorf("reading queue accounting: %w", err)
		}
		if v.Enq == 0 && v.Untracked == 0 && v.Seen == 0 {
			continue
		}
		var lost uint64
		if err := d.objs.SteerQueueLost.Lookup(core, &lost); err != nil {
			return nil, false, fmt.Errorf("reading lost frames: %w", err)
		}
		out = append(out, Queue{Core: int(core), Enqueued: v.Enq, Seen: v.Seen,
			DroppedRing: v.DroppedEnq, DroppedKthread: v.DroppedKthread, Lost: lost, Untracked: v.Untracked != 0})
	}
	var id uint32
	if err := d.objs.SteerQmaps.Lookup(uint32(0), &id); err != nil {
		return nil, false, fmt.Errorf("reading cpumap ids: %w", err)
	}
	return out, id != 0, nil
}

// BookLost counts n more frames of core's queues as lost: counted in,
// never seen nor reported dropped. Only lanes agent's reconciler
// (control/queues.go) calls it, and only when nothing can still be in
// those queues; the datapath then treats them as out, so the flows that
// wait for the core's queues to empty can move.
func (d *Datapath) BookLost(core int, n uint64) error {
	if core < 0 || core >= MaxCPUs {
		return fmt.Errorf("core %d out of range", core)
	}
	var lost uint64
	if err := d.objs.SteerQueueLost.Lookup(uint32(core), &lost); err != nil {
		return fmt.Errorf("reading lost frames: %w", err)
	}
	return d.setLost(core, lost+n)
}

// setLost sets core's booked-lost count (the reconciler, under its lock).
func (d *Datapath) setLost(core int, n uint64) error {
	if err := d.objs.SteerQueueLost.Put(uint32(core), n); err != nil {
		return fmt.Errorf("booking lost frames: %w", err)
	}
	return nil
}

// metaGen is the datapath's mark in the metadata's generation bits
// (bpf/maps.h, steer_cfg.meta_gen): the low 16 bits of its bulk cpumap's map
// id, which differ from the datapath loaded before it unless 65536 maps
// were created in between.
func (d *Datapath) metaGen() (uint32, error) {
	info, err := d.objs.SteerCpumap.Info()
	if err != nil {
		return 0, fmt.Errorf("reading the cpumap's id: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return 0, nil // no map ids: every datapath marks 0
	}
	return uint32(id) & 0xffff, nil
}

// Uncounted is what a flow's in-flight count (Flow.InFlight) carries on
// top of its frames once one of them went unmarked (bpf/order.h, UNCOUNTED).
const Uncounted = 1 << 40
