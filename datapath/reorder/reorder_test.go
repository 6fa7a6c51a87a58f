//go:build linux

package reorder

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// The tag's layout is mflow_tag.h's.
func TestTag(t *testing.T) {
	for _, c := range []struct {
		fh, gen, seq, want uint32
	}{
		{0, 0, 0, 0xa0000000},
		{0x7ff, 3, 0xffff, 0xbfffffff},
		{0x12345, 1, 0x10002, 0xab450002}, // high bits of each part dropped
	} {
		if got := Tag(c.fh, c.gen, c.seq); got != c.want {
			t.Errorf("Tag(%#x, %d, %#x) = %#x, want %#x", c.fh, c.gen, c.seq, got, c.want)
		}
		flow, seq, ok := Tagged(c.want)
		if !ok || flow != c.fh&0x7ff || seq != c.seq&0xffff {
			t.Errorf("Tagged(%#x) = %#x, %#x, %v", c.want, flow, seq, ok)
		}
	}
	// Ordinary priorities are never tags: TC_PRIO_*, class ids.
	for _, p := range []uint32{0, 6, 7, 15, 0x10001, 0x9fff0010, 0xc0000000} {
		if _, _, ok := Tagged(p); ok {
			t.Errorf("priority %#x reads as a tag", p)
		}
	}
}

func TestWindowSlots(t *testing.T) {
	for batch, want := range map[uint32]uint32{1: 64, 64: 64, 65: 128, 256: 256, 1000: 1024, 65536: maxWindowSlots} {
		if got := windowSlots(batch); got != want {
			t.Errorf("windowSlots(%d) = %d, want %d", batch, got, want)
		}
	}
	c := DefaultConfig(256, 2)
	if c.FlowLimit != 1024 || c.TotalLimit != 4096 || c.Timeout != DefaultTimeout || c.Check() != nil {
		t.Errorf("DefaultConfig(256, 2) = %+v", c)
	}
	// The limit stays below what the windows of one flow hold.
	if c := DefaultConfig(65536, 2); c.FlowLimit > (Windows-1)*maxWindowSlots {
		t.Errorf("DefaultConfig(65536, 2).FlowLimit = %d, above the windows' %d", c.FlowLimit, (Windows-1)*maxWindowSlots)
	}
}

func TestKind(t *testing.T) {
	a, b := Kind("", "veth1"), Kind("lanes-h2", "veth1")
	if a == b || len(a) > 15 || !strings.HasPrefix(a, "lanes_mf_") || Kind("", "veth1") != a {
		t.Errorf("kinds %q and %q: want distinct, stable, at most 15 characters", a, b)
	}
}

func TestConfigValue(t *testing.T) {
	c := DefaultConfig(64, 3)
	v, err := EncodeConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeConfig(v)
	if err != nil || got != c {
		t.Errorf("DecodeConfig(%s) = %+v (%v), want %+v", v, got, err, c)
	}
	for _, bad := range []Config{{}, {Batch: 1, Cores: 1, Timeout: time.Second}, {Batch: 1, Timeout: 1, FlowLimit: 1, TotalLimit: 1}} {
		if _, err := EncodeConfig(bad); err == nil {
			t.Errorf("EncodeConfig(%+v): no error", bad)
		}
	}
	e := knobs.Entry{Kind: KindQdisc, Knob: []byte(`{"device":"veth1","dir":"/sys/fs/bpf/lanes/host/reorder/veth1"}`)}
	if _, err := e.Decode(); err != nil {
		t.Errorf("a journaled qdisc knob does not decode: %v", err)
	}
}

// Without the struct_ops type in the kernel's BTF: one line, naming the
// minimum kernel and the config option, matching both sentinels.
func TestSupportedMissing(t *testing.T) {
	old := kernelSpec
	t.Cleanup(func() { kernelSpec = old })
	kernelSpec = func() (*btf.Spec, error) {
		b, err := btf.NewBuilder([]btf.Type{&btf.Int{Name: "int", Size: 4}}, nil)
		if err != nil {
			return nil, err
		}
		raw, err := b.Marshal(nil, nil)
		if err != nil {
			return nil, err
		}
		return btf.LoadSpecFromReader(strings.NewReader(string(raw)))
	}
	err := Supported()
	if err == nil || !errors.Is(err, ErrNotSupported) || !errors.Is(err, ebpf.ErrNotSupported) {
		t.Fatalf("Supported() = %v, want a not-supported error", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "6.16") || !strings.Contains(msg, "CONFIG_NET_SCH_BPF") {
		t.Errorf("Supported() says %q: want one line naming 6.16 and CONFIG_NET_SCH_BPF", msg)
	}
}

// The embedded object is the qdisc lanes expects: its five ops, its maps,
// and a kind the loader can rename.
func TestSpec(t *testing.T) {
	spec, err := loadReorder()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"mf_enqueue", "mf_dequeue", "mf_init", "mf_reset", "mf_destroy"} {
		ps := spec.Programs[p]
		if ps == nil || ps.Type != ebpf.StructOps || ps.AttachTo != "Qdisc_ops:"+strings.TrimPrefix(p, "mf_") {
			t.Errorf("program %s: %+v, want a Qdisc_ops op", p, ps)
		}
	}
	m := spec.Maps["mflow_reorder"]
	if err := setKind(m, "lanes_mf_abcdef"); err != nil {
		t.Fatal(err)
	}
	if v := m.Contents[0].Value.([]byte); !strings.HasPrefix(string(v), "lanes_mf_abcdef\x00") {
		t.Errorf("struct_ops value starts %q, want the kind", v[:16])
	}
	for _, name := range []string{"flow_slots", "win_slots", "fifo_slots"} {
		if spec.Variables[name] == nil {
			t.Errorf("no variable %s", name)
		}
	}
}
