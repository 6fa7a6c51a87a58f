//go:build linux

package reorder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/lanesnet/lanes/internal/bpfstats"
)

// Pin names inside a reassembler's directory.
const (
	pinLink   = "link" // the struct_ops link: the qdisc kind exists while it does
	pinConfig = "config"
	pinStats  = "stats"
	pinQueue  = "queue"
)

// Loaded is a reassembler loaded into the kernel: its qdisc kind is
// registered (tc can attach it) while the struct_ops link lives, in this
// process or pinned.
type Loaded struct {
	Kind string
	coll *ebpf.Collection
	link link.Link
}

// Load loads the reassembler for cfg under qdisc kind kind and registers
// the kind. Close unregisters it unless it was pinned; qdiscs of the kind
// already attached keep running until they are deleted.
func Load(kind string, cfg Config) (*Loaded, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if err := Supported(); err != nil {
		return nil, err
	}
	if len(kind) == 0 || len(kind) > 15 {
		return nil, fmt.Errorf("reorder: qdisc kind %q: want 1 to 15 characters", kind)
	}
	spec, err := loadReorder()
	if err != nil {
		return nil, err
	}
	win := windowSlots(cfg.Batch)
	for name, v := range map[string]uint32{"flow_slots": FlowSlots, "win_slots": win, "fifo_slots": FIFOSlots, "self_check": b2u(cfg.SelfCheck)} {
		vs := spec.Variables[name]
		if vs == nil {
			return nil, fmt.Errorf("reorder: the qdisc object has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("reorder: setting %s: %w", name, err)
		}
	}
	spec.Maps["mf_flows"].MaxEntries = FlowSlots
	spec.Maps["mf_fifo"].MaxEntries = FIFOSlots
	spec.Maps["mf_held"].MaxEntries = FlowSlots * Windows * win
	if err := setKind(spec.Maps["mflow_reorder"], kind); err != nil {
		return nil, err
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("reorder: loading the qdisc: %+v", ve)
		}
		return nil, fmt.Errorf("reorder: loading the qdisc: %w", err)
	}
	l := &Loaded{Kind: kind, coll: coll}
	if err := writeConfig(coll.Maps["mf_cfg"], cfg); err != nil {
		l.Close()
		return nil, err
	}
	l.link, err = link.AttachStructOps(link.StructOpsOptions{Map: coll.Maps["mflow_reorder"]})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("reorder: registering qdisc kind %s: %w", kind, err)
	}
	return l, nil
}

// setKind writes kind into the struct_ops value's id, the qdisc's name.
func setKind(m *ebpf.MapSpec, kind string) error {
	st, ok := m.Value.(*btf.Struct)
	if !ok || len(m.Contents) != 1 {
		return fmt.Errorf("reorder: struct_ops map %s is not one Qdisc_ops", m.Name)
	}
	val, ok := m.Contents[0].Value.([]byte)
	if !ok {
		return fmt.Errorf("reorder: struct_ops map %s has no value bytes", m.Name)
	}
	for _, mem := range st.Members {
		if mem.Name != "id" {
			continue
		}
		off := int(mem.Offset.Bytes())
		if off+16 > len(val) {
			break
		}
		id := val[off : off+16]
		clear(id)
		copy(id, kind)
		return nil
	}
	return fmt.Errorf("reorder: struct_ops map %s has no id member", m.Name)
}

func writeConfig(m *ebpf.Map, cfg Config) error {
	v := reorderMfConfig{Batch: cfg.Batch, Ncores: uint32(cfg.Cores), TimeoutNs: uint64(cfg.Timeout),
		FlowLimit: cfg.FlowLimit, TotalLimit: cfg.TotalLimit, SelfCheck: b2u(cfg.SelfCheck)}
	if err := m.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("reorder: writing the config: %w", err)
	}
	return nil
}

// Pin pins the link and the maps lanes reads into dir (made if missing).
func (l *Loaded) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("reorder: %w", err)
	}
	for name, m := range map[string]string{pinConfig: "mf_cfg", pinStats: "mf_stats", pinQueue: "mf_queue"} {
		if err := l.coll.Maps[m].Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("reorder: pinning %s: %w", name, err)
		}
	}
	// The link last: a pinned link means a complete directory.
	if err := l.link.Pin(filepath.Join(dir, pinLink)); err != nil {
		return fmt.Errorf("reorder: pinning the link: %w", err)
	}
	return nil
}

// Stats reads the counters.
func (l *Loaded) Stats() (Stats, error) {
	return readStats(l.coll.Maps["mf_stats"], l.coll.Maps["mf_queue"])
}

// Close closes lanes' handles: the kind goes unless it is pinned.
func (l *Loaded) Close() error {
	if l.link != nil {
		l.link.Close()
	}
	l.coll.Close()
	return nil
}

func readStats(stats, queue *ebpf.Map) (Stats, error) {
	var c reorderMfCounters
	var q reorderMfQstate
	if err := stats.Lookup(uint32(0), &c); err != nil {
		return Stats{}, fmt.Errorf("reorder: reading counters: %w", err)
	}
	if err := queue.Lookup(uint32(0), &q); err != nil {
		return Stats{}, fmt.Errorf("reorder: reading the queue state: %w", err)
	}
	return statsOf(c, q), nil
}

// Pinned is a reassembler found in its pin directory.
type Pinned struct {
	Dir                  string
	config, stats, queue *ebpf.Map
}

// Present reports whether dir holds a complete reassembler (its link).
func Present(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, pinLink))
	return err == nil
}

// Open opens the reassembler pinned in dir.
func Open(dir string) (*Pinned, error) {
	p := &Pinned{Dir: dir}
	for name, m := range map[string]**ebpf.Map{pinConfig: &p.config, pinStats: &p.stats, pinQueue: &p.queue} {
		var err error
		if *m, err = ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err != nil {
			p.Close()
			return nil, fmt.Errorf("reorder: opening the pinned reassembler in %s: %w", dir, err)
		}
	}
	return p, nil
}

// Stats reads the counters.
func (p *Pinned) Stats() (Stats, error) { return readStats(p.stats, p.queue) }

// Config reads the merge settings.
func (p *Pinned) Config() (Config, error) {
	var v reorderMfConfig
	if err := p.config.Lookup(uint32(0), &v); err != nil {
		return Config{}, fmt.Errorf("reorder: reading the config: %w", err)
	}
	return Config{Batch: v.Batch, Cores: int(v.Ncores), Timeout: time.Duration(v.TimeoutNs),
		FlowLimit: v.FlowLimit, TotalLimit: v.TotalLimit, SelfCheck: v.SelfCheck != 0}, nil
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// SetConfig changes the merge settings of the running qdisc. The batch
// must keep the window size the qdisc was loaded with (WindowSlots), and
// SelfCheck what it was loaded with (compiled in or out): QdiscKnob.load
// loads a new qdisc otherwise.
func (p *Pinned) SetConfig(cfg Config) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	return writeConfig(p.config, cfg)
}

// Close closes the maps.
func (p *Pinned) Close() error {
	for _, m := range []*ebpf.Map{p.config, p.stats, p.queue} {
		if m != nil {
			m.Close()
		}
	}
	return nil
}

// Unpin removes dir: the link pin first (the kind goes once nothing else
// holds the link), then the maps' pins. A missing dir is nothing to do.
func Unpin(dir string) error {
	path := filepath.Join(dir, pinLink)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		err = l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("reorder: unpinning %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		// Not a link (or unreadable): removing the file still drops
		// lanes' reference.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("reorder: removing %s: %w", path, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("reorder: removing %s: %w", dir, err)
	}
	return nil
}

// ProgramNames is the name of every program of the reassembler's object,
// as the kernel keeps it (cut to 15 characters; internal/bpfstats).
func ProgramNames() ([]string, error) {
	spec, err := loadReorder()
	if err != nil {
		return nil, err
	}
	return bpfstats.SpecNames(spec), nil
}
