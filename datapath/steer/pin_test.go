//go:build linux

package steer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// bpffsDir is an empty directory on a bpf filesystem: under /sys/fs/bpf if
// that is one, else a bpffs mounted for the test alone.
func bpffsDir(t *testing.T) string {
	t.Helper()
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/bpf", &st) == nil && st.Type == unix.BPF_FS_MAGIC {
		dir, err := os.MkdirTemp("/sys/fs/bpf", "lanes-steer-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Fatalf("mounting bpffs on %s: %v", dir, err)
	}
	// Registered after TempDir's cleanup, so it runs before the removal.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting test bpffs: %v", err)
		}
	})
	return dir
}

func TestPinOpenUnpin(t *testing.T) {
	d, cores := newDatapath(t)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	if err := d.Order().TrackQueues(dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	// Every pin Unpin knows, but the shortcut's drop traces: this
	// datapath's mode has no shortcut (TestSyncTracesOnlyWithTheShortcut).
	want := slices.DeleteFunc(slices.Sorted(slices.Values(pinNames())), isSyncTrace)
	if !slices.Equal(names, want) {
		t.Errorf("pins %v, want %v", names, want)
	}
	for _, want := range []string{PinXDP, PinTCIngress, PinTCEgress, "steer_cfg"} {
		if !slices.Contains(names, want) {
			t.Errorf("no pin %s", want)
		}
	}
	if err := d.Pin(dir); err != nil {
		t.Errorf("pinning again in place: %v", err)
	}
	other, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Pin(dir); !errors.Is(err, os.ErrExist) {
		t.Errorf("pinning a second datapath over the first: %v, want EEXIST", err)
	}

	// A restarted control plane sees and changes the same maps.
	d.Close()
	o, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	c, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	if !c.Enabled || !slices.Equal(c.CPUs, cores) || c.VXLANPort != testPort {
		t.Errorf("reopened config %+v", c)
	}
	if o.XDP().Type() != ebpf.XDP || o.TCIngress().Type() != ebpf.SchedCLS || o.TCEgress().Type() != ebpf.SchedCLS {
		t.Error("reopened programs have the wrong types")
	}
	setAll(t, o, StageSplit, 0)
	f := tcpFlow(40000)
	if ret, _ := runXDP(t, o, vxlanFrame(frameSpec{flow: f})); ret != xdpRedirect {
		t.Errorf("reopened XDP program: verdict %d, want XDP_REDIRECT", ret)
	}
	if fl := mustFlow(t, o, f, StageSplit); fl.CPUIndex != 0 {
		t.Errorf("flow on index %d, want 0", fl.CPUIndex)
	}

	// A missing pin is named.
	if err := os.Remove(filepath.Join(dir, "steer_flows")); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "steer_flows") {
		t.Errorf("opening with steer_flows unpinned: %v", err)
	}

	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory left behind: %v", err)
	}
	if err := Unpin(dir); err != nil {
		t.Errorf("unpinning nothing: %v", err)
	}
}

// TestUnpinKeepsForeignFiles: Unpin removes only its own pins and leaves a
// directory that holds anything else.
func TestUnpinKeepsForeignFiles(t *testing.T) {
	d, _ := newDatapath(t)
	dir := filepath.Join(bpffsDir(t), "shared")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other_map")
	if err := d.objs.SteerStats.Pin(other); err != nil {
		t.Fatal(err)
	}
	// A map an earlier build pinned goes too (retiredPins).
	retired, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer retired.Close()
	if err := retired.Pin(filepath.Join(dir, retiredPins[len(retiredPins)-1])); err != nil {
		t.Fatal(err)
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "other_map" {
		t.Errorf("left %v, want only other_map", entries)
	}
	if err := d.objs.SteerStats.Unpin(); err != nil {
		t.Fatal(err)
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
}

func TestPinNeedsBPFFS(t *testing.T) {
	d, _ := newDatapath(t)
	dir := filepath.Join(t.TempDir(), "sub", "lanes")
	err := d.Pin(dir)
	if err == nil || !strings.Contains(err.Error(), "not on a bpf filesystem") {
		t.Fatalf("pinning on a plain filesystem: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Pin created directories before failing: %v", err)
	}
	if _, err := Open(dir); err == nil {
		t.Error("Open of a directory without pins succeeded")
	}
}

// TestPinRollsBack: a Pin that fails half way leaves nothing of its own.
func TestPinRollsBack(t *testing.T) {
	d, _ := newDatapath(t)
	dir := filepath.Join(bpffsDir(t), "partial")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Occupy a name Pin reaches after some maps are pinned.
	squatter, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	if err := squatter.Pin(filepath.Join(dir, PinTCIngress)); err != nil {
		t.Fatal(err)
	}
	if err := d.Pin(dir); !errors.Is(err, os.ErrExist) {
		t.Fatalf("pinning over a squatter: %v, want EEXIST", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("failed Pin left %v", entries)
	}
	if err := squatter.Unpin(); err != nil {
		t.Fatal(err)
	}
}

// A datapath pinned by another version of lanes (here: one without a map
// this build has) cannot be opened whole, and says so, but its placement
// tables can still be restored and it can be unpinned: `lanes reset` after
// an upgrade finishes in one pass.
func TestOlderPinsStillReset(t *testing.T) {
	d, _ := newDatapath(t)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, steerMapSteerPrioSeen)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "another version of lanes pinned it") {
		t.Errorf("opening pins without %s: %v, want an error naming another version", steerMapSteerPrioSeen, err)
	}
	k := &TableKnob{Dir: dir, Stage: StageSplit}
	var stay [Buckets]uint32
	for i := range stay {
		stay[i] = Stay
	}
	if err := k.Write([]byte(FormatTable(stay))); err != nil {
		t.Errorf("restoring the split table of older pins: %v", err)
	}
	if b, err := k.Read(); err != nil || string(b) != FormatTable(stay) {
		t.Errorf("split table of older pins: %q (%v)", b, err)
	}
	sk := &SyncKnob{Dir: dir}
	if err := sk.Write(nil); err != nil {
		t.Errorf("restoring the sync destinations of older pins: %v", err)
	}
	// The collector still gives the counters.
	r := prometheus.NewRegistry()
	r.MustRegister(NewCollector(dir))
	if mfs, err := r.Gather(); err != nil || len(mfs) == 0 {
		t.Errorf("metrics of older pins: %d families (%v)", len(mfs), err)
	}
	// A table laid out differently cannot be restored: gone, so the
	// journal skips it and the reset goes on to unpin.
	if err := os.Remove(filepath.Join(dir, steerMapSteerTable)); err != nil {
		t.Fatal(err)
	}
	other, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Pin(filepath.Join(dir, steerMapSteerTable)); err != nil {
		t.Fatal(err)
	}
	if err := k.Write([]byte(FormatTable(stay))); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("restoring a table of another layout: %v, want it gone", err)
	}
	if err := (&DatapathKnob{Dir: dir}).Write(nil); err != nil {
		t.Errorf("unpinning older pins: %v", err)
	}
	if Pinned(dir) {
		t.Error("older pins left behind")
	}
}

func isSyncTrace(pin string) bool {
	return pin == dropTraces[3].pin || pin == dropTraces[4].pin
}

// The shortcut's drop traces (xdp_devmap_xmit, xdp_redirect_err) fire on
// every XDP redirect of the host, anyone's: TrackQueues attaches them only
// for a mode with the shortcut, and a reload into a mode without takes
// them away.
func TestSyncTracesOnlyWithTheShortcut(t *testing.T) {
	d, cores := newDatapath(t)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unpin(dir) })
	traces := func() []string {
		t.Helper()
		if err := d.Order().TrackQueues(dir); err != nil {
			var nt *NoDropTracesError
			if !errors.As(err, &nt) {
				t.Fatal(err)
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			if isSyncTrace(e.Name()) {
				got = append(got, e.Name())
			}
		}
		return got
	}
	if got := traces(); len(got) != 0 {
		t.Errorf("without the shortcut: %v attached, want none", got)
	}
	sync := Config{Enabled: true, CPUs: cores, Flowlet: time.Hour, VXLANPort: testPort, VNIs: []uint32{testVNI}, Prio: true, Sync: true}
	if err := d.SetConfig(sync); err != nil {
		t.Fatal(err)
	}
	if got := traces(); len(got) != 2 {
		t.Errorf("with the shortcut: %v attached, want both traces", got)
	}
	sync.Sync = false
	if err := d.SetConfig(sync); err != nil {
		t.Fatal(err)
	}
	if got := traces(); len(got) != 0 {
		t.Errorf("reloaded without the shortcut: %v left attached", got)
	}
}

// TestHighAutoStampFollowsThePins: the stamp stays while the same objects
// are pinned, whatever their contents, and changes when another datapath
// is pinned in their place; with nothing pinned it says the datapath is
// gone.
func TestHighAutoStampFollowsThePins(t *testing.T) {
	d, _ := newDatapath(t)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if _, err := HighAutoStamp(dir); !errors.Is(err, knobs.ErrGone) {
		t.Fatalf("nothing pinned: %v, want ErrGone", err)
	}
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	first, err := HighAutoStamp(dir)
	if err != nil {
		t.Fatal(err)
	}
	addRule(t, d, "dst 198.19.0.21 port 80 tcp")
	if again, err := HighAutoStamp(dir); err != nil || again != first {
		t.Errorf("same pins, a map written: stamp %q (%v), want %q", again, err, first)
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	other, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Pin(dir); err != nil {
		t.Fatal(err)
	}
	defer Unpin(dir)
	if next, err := HighAutoStamp(dir); err != nil || next == first {
		t.Errorf("another datapath pinned: stamp %q (%v), want a new one", next, err)
	}
}
