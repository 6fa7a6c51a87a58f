//go:build linux

package steer

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// Placement is Falcon's placement (bpf/place.h): the tables, the flows'
// activity, the stages at home.
type Placement struct{ *core }

func (d *Datapath) Placement() Placement { return Placement{d.core} }

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
func (d Placement) SetTable(stage int, t [Buckets]uint32) error {
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
func (d Placement) Tables() ([NumStages][Buckets]uint32, error) {
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
func (d Placement) Table(stage int) ([Buckets]uint32, error) {
	if err := checkStage(stage); err != nil {
		return [Buckets]uint32{}, err
	}
	t, err := d.Tables()
	return t[stage], err
}

// SetBucket points one bucket of a stage's table at a core index (or Stay).
func (d Placement) SetBucket(stage, bucket int, idx uint32) error {
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
func (d Placement) Activity(window time.Duration) (Activity, error) {
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
func (d Placement) Home() ([NumStages]bool, error) {
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
func (d Placement) SetHome(stage int, on bool) error {
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

// HomeBare reports whether the bridge stage at home runs every frame on
// without looking its flow up (SetHomeBare).
func (d Placement) HomeBare() (bool, error) {
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
func (d Placement) SetHomeBare() error {
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
func (d Placement) HomeQueues(home int) (bool, error) {
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
func (d *core) leavingHome(stage int) error {
	if stage != StageBridge || d.mode.Flags&directOff != 0 {
		return Placement{d}.DeleteStageFlows(stage)
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
		v.SlotWin = 0 // noted anew in its slot at its next frame
		// Exist only: an entry evicted meanwhile stays gone, and the
		// fast path runs that flow on as one without state.
		if err := d.objs.SteerFlows.Update(&e.k, &v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("restarting a flow state: %w", err)
		}
	}
	return nil
}

// DeleteStageFlows removes every flow state of a stage.
func (d Placement) DeleteStageFlows(stage int) error {
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
