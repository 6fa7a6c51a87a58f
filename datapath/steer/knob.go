//go:build linux

package steer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanesnet/lanes/datapath/knobs"
	"golang.org/x/sys/unix"
)

// Knob kinds of the steering datapath, journaled like sysfs files so a
// reset after a crash unpins what an apply pinned.
const (
	KindDatapath = "steer-datapath"
	KindTable    = "steer-table"
)

func init() {
	knobs.Register(KindDatapath, func() knobs.Knob { return &DatapathKnob{} })
	knobs.Register(KindTable, func() knobs.Knob { return &TableKnob{} })
}

// Setup is the value of a DatapathKnob: what is loaded and how it is
// configured. Tables are not part of it: they start at Stay and TableKnob
// (or an agent) sets them.
type Setup struct {
	Config Config `json:"config"`
	// CPUMap are the cores with a cpumap entry (the split cores).
	CPUMap    []int  `json:"cpumap,omitempty"`
	QueueSize uint32 `json:"queue_size,omitempty"`
	// RTPriority, when > 0, runs the cpumap kthreads lanes creates as
	// SCHED_FIFO at this priority. On PREEMPT_NONE kernels a kthread that
	// shares its core with a busy task gets the core only when that task
	// yields; real-time priority lets the split stage run when its frames
	// arrive. The threads belong to lanes' cpumap entries and die with
	// them, so there is no host setting to restore.
	RTPriority int `json:"rt_priority,omitempty"`
	// HiCPUMap are the cores with a high-priority queue (Config.Prio), and
	// HiRTPriority the SCHED_FIFO priority of its kthreads (0: normal).
	HiCPUMap     []int `json:"hi_cpumap,omitempty"`
	HiRTPriority int   `json:"hi_rt_priority,omitempty"`
	// BulkPolicy, when RTPriority is 0, is the fair policy of the (bulk)
	// cpumap kthreads: "" or "other" (normal), "batch" (never preempts a
	// task when woken) or "idle" (yields to every normal task: receive
	// work gets what the applications leave of the core).
	BulkPolicy string `json:"bulk_policy,omitempty"`
}

// Encode is Setup as a knob value.
func (s Setup) Encode() (string, error) {
	if s.Config.Flowlet < 0 || s.Config.Drain < 0 {
		return "", errors.New("steer: negative flowlet or drain timeout")
	}
	b, err := json.Marshal(setupDoc{
		Enabled: s.Config.Enabled, CPUs: s.Config.CPUs, FlowletNS: int64(s.Config.Flowlet), DrainNS: int64(s.Config.Drain),
		Port: s.Config.VXLANPort, VNIs: s.Config.VNIs, CPUMap: s.CPUMap, QueueSize: s.QueueSize, RTPriority: s.RTPriority,
		Prio: s.Config.Prio, CountSplit: s.Config.CountSplit, HiCPUMap: s.HiCPUMap, HiRTPriority: s.HiRTPriority,
		NoBridgeCount: s.Config.NoBridgeCount, StayQueued: s.Config.StayQueued, MFlow: encodeMFlowDoc(s.Config.MFlow), Sync: s.Config.Sync,
		PrioIdleInline: s.Config.PrioIdleInline, PrioQuietMS: int64(s.Config.PrioQuiet / time.Millisecond), HighAutoPPS: s.Config.HighAutoPPS, BulkQuietMS: int64(s.Config.BulkQuiet / time.Millisecond), BulkAutoMS: int64(s.Config.BulkAuto / time.Millisecond), InlineCPU: s.Config.InlineCPU, AsideBelow: s.Config.AsideBelow, AsideDepth: s.Config.AsideDepth,
		BulkPolicy: s.BulkPolicy, VethClass: s.Config.VethClass, Fast: s.Config.Fast, FastIdleMS: int64(s.Config.FastIdle / time.Millisecond), FastNoGSO: s.Config.FastNoGSO,
		FastBeside: s.Config.FastBeside,
	})
	return string(b), err
}

// mflowDoc is Config.MFlow in a knob value; absent when splitting is off,
// so the values of modes without it read as before.
type mflowDoc struct {
	At        string `json:"at"`
	Batch     uint32 `json:"batch"`
	Cores     []int  `json:"cores"`
	Threshold uint32 `json:"threshold_frames"`
	WindowNS  int64  `json:"window_ns"`
	QuietNS   int64  `json:"quiet_ns,omitempty"`
}

func encodeMFlowDoc(m MFlow) *mflowDoc {
	if m.At == SplitOff {
		return nil
	}
	return &mflowDoc{At: m.At.String(), Batch: m.Batch, Cores: m.Cores, Threshold: m.Threshold, WindowNS: int64(m.Window), QuietNS: int64(m.Quiet)}
}

func (d *mflowDoc) decode() (MFlow, error) {
	if d == nil {
		return MFlow{}, nil
	}
	m := MFlow{Batch: d.Batch, Cores: d.Cores, Threshold: d.Threshold, Window: time.Duration(d.WindowNS), Quiet: time.Duration(d.QuietNS)}
	for at := range mflowFlag {
		if at.String() == d.At {
			m.At = at
		}
	}
	if m.At == SplitOff {
		return m, fmt.Errorf("steer datapath value: micro-flow split point %q: want irq or bridge", d.At)
	}
	return m, nil
}

// setupDoc spells the durations out, so a journal reads without Go's
// time.Duration encoding in mind.
type setupDoc struct {
	Enabled       bool      `json:"enabled"`
	CPUs          []int     `json:"cpus"`
	FlowletNS     int64     `json:"flowlet_ns"`
	DrainNS       int64     `json:"drain_ns,omitempty"`
	Port          uint16    `json:"vxlan_port"`
	VNIs          []uint32  `json:"vnis"`
	CPUMap        []int     `json:"cpumap,omitempty"`
	QueueSize     uint32    `json:"queue_size,omitempty"`
	RTPriority    int       `json:"rt_priority,omitempty"`
	Prio          bool      `json:"prio,omitempty"`
	CountSplit    bool      `json:"count_split,omitempty"`
	HiCPUMap      []int     `json:"hi_cpumap,omitempty"`
	HiRTPriority  int       `json:"hi_rt_priority,omitempty"`
	NoBridgeCount bool      `json:"no_bridge_count,omitempty"`
	StayQueued    bool      `json:"stay_queued,omitempty"`
	MFlow         *mflowDoc `json:"mflow,omitempty"`
	Sync          bool      `json:"sync,omitempty"`
	// PrioIdleInline: omitted when false, so setups journaled before it
	// existed decode unchanged.
	PrioIdleInline bool   `json:"prio_idle_inline,omitempty"`
	PrioQuietMS    int64  `json:"prio_quiet_ms,omitempty"`
	HighAutoPPS    uint32 `json:"high_auto_pps,omitempty"`
	BulkQuietMS    int64  `json:"bulk_quiet_ms,omitempty"`
	BulkAutoMS     int64  `json:"bulk_auto_ms,omitempty"`
	AsideBelow     uint32 `json:"aside_below,omitempty"`
	AsideDepth     uint32 `json:"aside_depth,omitempty"`
	// InlineCPU: omitted when 0; with one core it is that core, which
	// DecodeSetup fills in for values written before it existed.
	InlineCPU  int    `json:"inline_cpu,omitempty"`
	VethClass  bool   `json:"veth_class,omitempty"`
	BulkPolicy string `json:"bulk_policy,omitempty"`
	Fast       bool   `json:"fast,omitempty"`
	FastIdleMS int64  `json:"fast_idle_ms,omitempty"`
	FastNoGSO  bool   `json:"fast_no_gso,omitempty"`
	FastBeside bool   `json:"fast_beside,omitempty"`
}

// DecodeSetup parses a DatapathKnob value.
func DecodeSetup(v string) (Setup, error) {
	var d setupDoc
	if err := json.Unmarshal([]byte(v), &d); err != nil {
		return Setup{}, fmt.Errorf("steer datapath value: %w", err)
	}
	mf, err := d.MFlow.decode()
	if err != nil {
		return Setup{}, err
	}
	if d.PrioIdleInline && len(d.CPUs) == 1 {
		d.InlineCPU = d.CPUs[0]
	}
	return Setup{
		Config: Config{Enabled: d.Enabled, CPUs: d.CPUs, Flowlet: time.Duration(d.FlowletNS), Drain: time.Duration(d.DrainNS), VXLANPort: d.Port, VNIs: d.VNIs, Prio: d.Prio, CountSplit: d.CountSplit,
			NoBridgeCount: d.NoBridgeCount, StayQueued: d.StayQueued, MFlow: mf, Sync: d.Sync, PrioIdleInline: d.PrioIdleInline,
			PrioQuiet: time.Duration(d.PrioQuietMS) * time.Millisecond, HighAutoPPS: d.HighAutoPPS, BulkQuiet: time.Duration(d.BulkQuietMS) * time.Millisecond, BulkAuto: time.Duration(d.BulkAutoMS) * time.Millisecond, InlineCPU: d.InlineCPU, AsideBelow: d.AsideBelow, AsideDepth: d.AsideDepth, VethClass: d.VethClass,
			Fast: d.Fast, FastIdle: time.Duration(d.FastIdleMS) * time.Millisecond, FastNoGSO: d.FastNoGSO, FastBeside: d.FastBeside},
		CPUMap: d.CPUMap, QueueSize: d.QueueSize, RTPriority: d.RTPriority,
		HiCPUMap: d.HiCPUMap, HiRTPriority: d.HiRTPriority, BulkPolicy: d.BulkPolicy,
	}, nil
}

// DatapathKnob is the steering datapath loaded and pinned in Dir. Value ""
// means absent: writing it unpins everything (attached links hold their
// programs until their own knobs detach them). Any other value is a Setup:
// writing it loads and pins the datapath if it is not there, then
// configures it with every table at Stay.
type DatapathKnob struct {
	Dir string `json:"dir"`
}

func (k *DatapathKnob) Kind() string { return KindDatapath }
func (k *DatapathKnob) Key() string  { return KindDatapath + ":" + k.Dir }

func (k *DatapathKnob) Read() ([]byte, error) {
	if !Pinned(k.Dir) {
		return []byte{}, nil
	}
	d, err := Open(k.Dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	c, err := d.Config()
	if err != nil {
		return nil, err
	}
	cm, err := d.CPUMap().Entries()
	if err != nil {
		return nil, err
	}
	hi, err := d.HiCPUMap().Entries()
	if err != nil {
		return nil, err
	}
	v, err := Setup{Config: c, CPUMap: cm, HiCPUMap: hi}.Encode()
	return []byte(v), err
}

func (k *DatapathKnob) Write(v []byte) error {
	if len(v) == 0 {
		return Unpin(k.Dir)
	}
	s, err := DecodeSetup(string(v))
	if err != nil {
		return err
	}
	var d *Datapath
	if Pinned(k.Dir) {
		d, err = Open(k.Dir)
	} else {
		if d, err = LoadFor(s.Config); err == nil {
			if err = d.Pin(k.Dir); err == nil {
				// Without the drop tracepoints the queues stay
				// untracked (drain time), which status reports.
				var nt *NoDropTracesError
				if err = d.Order().TrackQueues(k.Dir); errors.As(err, &nt) {
					err = nil
				} else if err != nil {
					_ = Unpin(k.Dir)
				}
			}
			if err != nil {
				d.Close()
			}
		}
	}
	if err != nil {
		return err
	}
	defer d.Close()
	var stay [Buckets]uint32
	for i := range stay {
		stay[i] = Stay
	}
	for st := 0; st < NumStages; st++ {
		if err := d.Placement().SetTable(st, stay); err != nil {
			return err
		}
	}
	if err := d.SetConfig(s.Config); err != nil {
		return err
	}
	q := s.QueueSize
	if q == 0 {
		q = 2048
	}
	for _, cm := range []struct {
		m     *ebpf.Map
		what  string
		cores []int
		rt    int
		fair  string
	}{
		{d.objs.SteerCpumap, "cpumap", s.CPUMap, s.RTPriority, s.BulkPolicy},
		{d.objs.SteerCpumapHi, "high-priority cpumap", s.HiCPUMap, s.HiRTPriority, ""},
	} {
		have, err := cpuMapEntries(cm.m, cm.what)
		if err != nil {
			return err
		}
		for _, c := range cm.cores {
			if err := putCPUMap(cm.m, cm.what, c, q); err != nil {
				return err
			}
		}
		for _, c := range have {
			if !slices.Contains(cm.cores, c) {
				if err := delCPUMap(cm.m, cm.what, c); err != nil {
					return err
				}
			}
		}
		var a *unix.SchedAttr
		switch {
		case cm.rt > 0:
			a = &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: uint32(cm.rt)}
		case cm.fair == "batch":
			a = &unix.SchedAttr{Policy: unix.SCHED_BATCH}
		case cm.fair == "idle":
			a = &unix.SchedAttr{Policy: unix.SCHED_IDLE}
		case cm.fair != "" && cm.fair != "other":
			return fmt.Errorf("steer: unknown bulk kthread policy %q (want other, batch or idle)", cm.fair)
		}
		if a != nil {
			if err := setCPUMapSched(cm.m, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// Pinned says whether dir holds a pinned steering datapath (its config
// map's pin), so callers can tell "nothing applied" from a broken pin.
func Pinned(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, steerMapSteerCfg))
	return err == nil
}

// TableKnob is one stage's placement table. Its value is FormatTable's
// text. With the datapath gone there is nothing to restore (ErrGone).
type TableKnob struct {
	Dir   string `json:"dir"`
	Stage int    `json:"stage"`
}

func (k *TableKnob) Kind() string { return KindTable }
func (k *TableKnob) Key() string  { return KindTable + ":" + k.Dir + ":" + StageName(k.Stage) }

// open opens the placement tables alone (see openForRestore).
func (k *TableKnob) open() (*Datapath, error) {
	return openForRestore(k.Dir, steerMapSteerTable)
}

func (k *TableKnob) Read() ([]byte, error) {
	d, err := k.open()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	t, err := d.Placement().Table(k.Stage)
	if err != nil {
		return nil, err
	}
	return []byte(FormatTable(t)), nil
}

func (k *TableKnob) Write(v []byte) error {
	t, err := ParseTable(string(v))
	if err != nil {
		return err
	}
	d, err := k.open()
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Placement().SetTable(k.Stage, t)
}

// FormatTable writes a table as Buckets comma-separated entries, "s" for
// Stay, run-length compressed as "VALUE*COUNT" so a journal stays readable.
func FormatTable(t [Buckets]uint32) string {
	var parts []string
	for i := 0; i < Buckets; {
		j := i
		for j < Buckets && t[j] == t[i] {
			j++
		}
		v := "s"
		if t[i] != Stay {
			v = strconv.FormatUint(uint64(t[i]), 10)
		}
		if j-i > 1 {
			v += "*" + strconv.Itoa(j-i)
		}
		parts = append(parts, v)
		i = j
	}
	return strings.Join(parts, ",")
}

// ParseTable reads FormatTable's text.
func ParseTable(s string) ([Buckets]uint32, error) {
	var t [Buckets]uint32
	n := 0
	for _, p := range strings.Split(strings.TrimSpace(s), ",") {
		val, cnt, rep := strings.Cut(p, "*")
		c := 1
		if rep {
			var err error
			if c, err = strconv.Atoi(cnt); err != nil || c < 1 {
				return t, fmt.Errorf("steer table: bad count in %q", p)
			}
		}
		v := Stay
		if val != "s" {
			x, err := strconv.ParseUint(val, 10, 32)
			if err != nil || x >= MaxCPUs {
				return t, fmt.Errorf("steer table: bad entry %q (want s or a core index below %d)", p, MaxCPUs)
			}
			v = uint32(x)
		}
		if n+c > Buckets {
			return t, fmt.Errorf("steer table: more than %d entries", Buckets)
		}
		for i := 0; i < c; i++ {
			t[n+i] = v
		}
		n += c
	}
	if n != Buckets {
		return t, fmt.Errorf("steer table: %d entries, want %d", n, Buckets)
	}
	return t, nil
}
