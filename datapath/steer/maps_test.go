//go:build linux

package steer

import (
	"slices"
	"testing"
	"time"
)

func TestConfigRoundTrip(t *testing.T) {
	d, _ := newDatapath(t)
	in := Config{Enabled: true, CPUs: []int{5, 0, 63}, Flowlet: 250 * time.Microsecond, VXLANPort: 8472, VNIs: []uint32{1, 300}}
	if err := d.SetConfig(in); err != nil {
		t.Fatal(err)
	}
	in.VNIs = []uint32{300, 2}
	if err := d.SetConfig(in); err != nil {
		t.Fatal(err)
	}
	got, err := d.Config()
	if err != nil {
		t.Fatal(err)
	}
	if !got.Enabled || !slices.Equal(got.CPUs, []int{0, 5, 63}) || got.Flowlet != in.Flowlet ||
		got.VXLANPort != 8472 || !slices.Equal(got.VNIs, []uint32{2, 300}) {
		t.Errorf("read back %+v", got)
	}
	if err := d.SetConfig(Config{CPUs: []int{1, 1}, VXLANPort: 1}); err == nil {
		t.Error("SetConfig accepted a duplicate core")
	}
}

// TestEncodeConfigMatchesRPSHash: the ranges SetConfig writes for the tc
// programs (with bpf/flow.h's arithmetic) give what RPSHash predicts.
func TestEncodeConfigMatchesRPSHash(t *testing.T) {
	for n := 1; n <= MaxCPUs; n++ {
		c := Config{CPUs: make([]int, n)}
		for i := range n {
			c.CPUs[i] = i
		}
		k := encodeConfig(c)
		for i := range n {
			for _, fh := range []uint32{0, 1, 12345, 0xdeadbeef, ^uint32(0)} {
				for _, counted := range []uint32{0, 1} {
					for _, epoch := range []uint32{0, 3, HashEpochs - 1} {
						// bpf/flow.h's rps_hash arithmetic, on the config's fields (bridge stage).
						v := (k.RpsLo[i]+1)&^1 + (fh%((k.RpsSpan-1)/2/HashEpochs)*HashEpochs+epoch)*2 + counted
						if v == 0 { // "0 is no hash"
							v = 2
						}
						if want := RPSHash(i, n, fh, StageBridge, epoch, counted == 1); v != want {
							t.Fatalf("n=%d core %d fh %#x epoch %d counted %d: config gives %#x, RPSHash %#x", n, i, fh, epoch, counted, v, want)
						}
					}
				}
			}
		}
	}
}

func TestTables(t *testing.T) {
	d, _ := newDatapath(t)
	var tab [Buckets]uint32
	for b := range tab {
		tab[b] = uint32(b % 3)
	}
	tab[7] = Stay
	if err := d.Placement().SetTable(StageBridge, tab); err != nil {
		t.Fatal(err)
	}
	if err := d.Placement().SetBucket(StageBridge, 8, 63); err != nil {
		t.Fatal(err)
	}
	tab[8] = 63
	got, err := d.Placement().Table(StageBridge)
	if err != nil {
		t.Fatal(err)
	}
	if got != tab {
		t.Errorf("bridge table read back differs")
	}
	if other, _ := d.Placement().Table(StageSplit); other[0] != Stay {
		t.Errorf("writing the bridge table changed the split table")
	}
	for name, err := range map[string]error{
		"stage 3":    d.Placement().SetBucket(NumStages, 0, 0),
		"bucket 256": d.Placement().SetBucket(StageSplit, Buckets, 0),
		"index 64":   d.Placement().SetBucket(StageSplit, 0, MaxCPUs),
		"table idx":  d.Placement().SetTable(StageSplit, [Buckets]uint32{MaxCPUs}),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := d.Placement().Table(-1); err == nil {
		t.Error("Table(-1) accepted")
	}
}

func TestCPUMapEntries(t *testing.T) {
	d, cores := newDatapath(t)
	got, err := d.CPUMap().Entries()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, cores) {
		t.Errorf("entries %v, want %v", got, cores)
	}
	if err := d.CPUMap().Del(cores[0]); err != nil {
		t.Fatal(err)
	}
	if err := d.CPUMap().Del(cores[0]); err != nil {
		t.Errorf("deleting a missing entry: %v", err)
	}
	if got, _ := d.CPUMap().Entries(); !slices.Equal(got, cores[1:]) {
		t.Errorf("after delete: %v, want %v", got, cores[1:])
	}
	for _, bad := range []struct {
		cpu   int
		qsize uint32
	}{{-1, 64}, {MaxCPUs, 64}, {0, 0}} {
		if err := d.CPUMap().Set(bad.cpu, bad.qsize); err == nil {
			t.Errorf("SetCPUMapEntry(%d, %d) accepted", bad.cpu, bad.qsize)
		}
	}
}
