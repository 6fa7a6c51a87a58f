//go:build linux

package steer

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// steer_cfg.flags bits: the runtime switches (the mode's are in mode.go),
// bpf/consts.h's CFG_ENABLED, CFG_HOME(0) and CFG_HOME_BARE, as
// TestConstsMatchC checks.
const (
	cfgEnabled  = 1
	cfgHome     = 0x80   // << stage: the stage is at home (SetHome)
	cfgHomeBare = 0x2000 // the bridge stage's bare path at home (SetHomeBare)
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
	if err := d.Prio().SetAside(0); err != nil {
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
		k.MfQuietNs = uint64(m.Quiet)
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
	m.Batch, m.Threshold, m.Window, m.Quiet = k.MfBatch, k.MfThresh, time.Duration(k.MfWindowNs), time.Duration(k.MfQuietNs)
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
func (d *core) configOnly() (Config, error) {
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
		InlineCPU:      int(m.InlineCpu),
		AsideBelow:     m.AsidePct,
		AsideDepth:     m.AsideDepth,
		Fast:           m.Flags&modeFast != 0,
		FastIdle:       time.Duration(m.FastIdleMs) * time.Millisecond,
		FastNoGSO:      m.Flags&modeFastNoGSO != 0,
		FastBeside:     m.Flags&modeFastBeside != 0,
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
