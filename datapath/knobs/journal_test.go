package knobs_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// memKnob is a knob on a plain file, for testing the journal's logic without
// the kernel. A file named Path+".fail" makes writes fail; every write is
// appended to Log.
type memKnob struct {
	Path string `json:"path"`
	Log  string `json:"log"`
}

func (k *memKnob) Kind() string { return "test-file" }
func (k *memKnob) Key() string  { return "test-file:" + k.Path }
func (k *memKnob) Read() ([]byte, error) {
	b, err := os.ReadFile(k.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", k.Path, knobs.ErrGone)
	}
	return b, err
}
func (k *memKnob) Write(v []byte) error {
	if _, err := os.Stat(k.Path + ".fail"); err == nil {
		return errors.New("injected failure")
	}
	if _, err := os.Stat(k.Path); err != nil {
		return fmt.Errorf("%s: %w", k.Path, knobs.ErrGone)
	}
	f, err := os.OpenFile(k.Log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "%s=%s\n", filepath.Base(k.Path), v)
	f.Close()
	return os.WriteFile(k.Path, v, 0o644)
}

func init() { knobs.Register("test-file", func() knobs.Knob { return &memKnob{} }) }

func memKnobs(t *testing.T, n int) (dir string, ks []*memKnob) {
	dir = t.TempDir()
	for i := range n {
		k := &memKnob{Path: filepath.Join(dir, fmt.Sprintf("k%d", i)), Log: filepath.Join(dir, "log")}
		// Originals end without a newline or with odd bytes on purpose:
		// restore must be exact, not "equal after trimming".
		if err := os.WriteFile(k.Path, []byte(fmt.Sprintf("orig%d\x00\n ", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	return dir, ks
}

func TestJournalLogic(t *testing.T) {
	dir, ks := memKnobs(t, 3)
	state := filepath.Join(dir, "state")
	j, err := knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()

	if _, err := knobs.Open(state, "host"); err == nil || !strings.Contains(err.Error(), "in use by another lanes process") {
		t.Errorf("second Open = %v, want in-use error", err)
	}
	for i, k := range ks {
		if err := j.Set(k, []byte(fmt.Sprintf("new%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// A second write to a knob keeps the first original.
	if err := j.Set(ks[0], []byte("newer0")); err != nil {
		t.Fatal(err)
	}
	if j.Len() != 3 {
		t.Fatalf("journal has %d entries, want 3", j.Len())
	}
	os.Remove(ks[0].Log)
	rep, err := j.Restore()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Restored) != 3 || len(rep.Skipped)+len(rep.Failed) != 0 {
		t.Errorf("report %+v, want 3 restored", rep)
	}
	for i, k := range ks {
		b, _ := os.ReadFile(k.Path)
		if want := fmt.Sprintf("orig%d\x00\n ", i); string(b) != want {
			t.Errorf("%s = %q, want %q", k.Path, b, want)
		}
	}
	log, _ := os.ReadFile(ks[0].Log)
	if want := "k2=orig2\x00\n \nk1=orig1\x00\n \nk0=orig0\x00\n \n"; string(log) != want {
		t.Errorf("restore order:\n%s\nwant newest first:\n%s", log, want)
	}
	if knobs.Exists(state) {
		t.Error("journal still exists after a full restore")
	}
}

func TestJournalGoneAndFailed(t *testing.T) {
	dir, ks := memKnobs(t, 3)
	state := filepath.Join(dir, "state")
	j, err := knobs.Open(state, "lanes-x")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		if err := j.Set(k, []byte("new")); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(ks[0].Path)                        // its "device" disappeared
	os.WriteFile(ks[1].Path+".fail", nil, 0o644) // a write that fails
	rep, err := j.Restore()
	if err == nil {
		t.Fatal("restore with a failing knob succeeded")
	}
	if len(rep.Skipped) != 1 || rep.Skipped[0].Key != ks[0].Key() {
		t.Errorf("skipped %+v, want %s", rep.Skipped, ks[0].Key())
	}
	if len(rep.Failed) != 1 || rep.Failed[0].Key != ks[1].Key() {
		t.Errorf("failed %+v, want %s", rep.Failed, ks[1].Key())
	}
	if !slices.Equal(rep.Restored, []string{ks[2].Key()}) {
		t.Errorf("restored %v, want %s", rep.Restored, ks[2].Key())
	}
	j.Close()

	// The failed knob stays journaled for another try, from a new process.
	ents, err := knobs.ReadEntries(state)
	if err != nil || len(ents) != 1 || ents[0].Key != ks[1].Key() {
		t.Fatalf("journal after partial restore: %+v, %v", ents, err)
	}
	if _, err := knobs.Open(state, "other"); err == nil {
		t.Error("opening a journal for another target succeeded")
	}
	os.Remove(ks[1].Path + ".fail")
	j, err = knobs.Open(state, "lanes-x")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, err := j.Restore(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(ks[1].Path); string(b) != "orig1\x00\n " {
		t.Errorf("retried knob = %q", b)
	}
}

func TestJournalDecode(t *testing.T) {
	for _, k := range []knobs.Knob{
		knobs.Sysfs("ns1", "/sys/class/net/eth0/threaded"),
		knobs.Sysctl("", "net.core.rps_sock_flow_entries"),
		knobs.Affinity("napi/eth0-8195", 0),
		knobs.Sched("napi/vx0-0", 1),
	} {
		raw, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		back, err := knobs.Decode(k.Kind(), raw)
		if err != nil {
			t.Fatal(err)
		}
		if back.Key() != k.Key() {
			t.Errorf("decoded key %q, want %q", back.Key(), k.Key())
		}
	}
	if _, err := knobs.Decode("nope", []byte("{}")); err == nil || !strings.Contains(err.Error(), "unknown knob kind") {
		t.Errorf("decoding an unknown kind: %v", err)
	}
	if k := knobs.Sysctl("", "net.core.rps_sock_flow_entries"); k.Path != "/proc/sys/net/core/rps_sock_flow_entries" {
		t.Errorf("sysctl path %q", k.Path)
	}
}

// TestJournalOpenVariants: OpenExisting never makes the directory (lanes
// agent must not bring back what a reset removed); OpenWait waits for a
// holder that lets go in time, where Open fails at once with ErrBusy.
func TestJournalOpenVariants(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "target")
	if _, err := knobs.OpenExisting(dir, "t"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenExisting on a missing dir: %v, want ErrNotExist", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenExisting made %s", dir)
	}
	held, err := knobs.Open(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := knobs.Open(dir, "t"); !errors.Is(err, knobs.ErrBusy) {
		t.Fatalf("Open while held: %v, want ErrBusy", err)
	}
	if _, err := knobs.OpenWait(dir, "t", 100*time.Millisecond); !errors.Is(err, knobs.ErrBusy) {
		t.Fatalf("OpenWait held past its wait: %v, want ErrBusy", err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		held.Close()
	}()
	j, err := knobs.OpenWait(dir, "t", 10*time.Second)
	if err != nil {
		t.Fatalf("OpenWait with a holder that lets go: %v", err)
	}
	j.Close()
	j, err = knobs.OpenExisting(dir, "t")
	if err != nil {
		t.Fatalf("OpenExisting on the dir: %v", err)
	}
	j.Close()
}

// TestJournalWaitOutlivesRemoval: a reset removes the directory while it
// holds the lock. Whoever waited for that lock must end up holding the lock
// of the directory now at that path, not of the removed one: otherwise a
// third process could lock the new directory too, and two would journal
// into the same journal.json.
func TestJournalWaitOutlivesRemoval(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "target")
	held, err := knobs.Open(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		os.RemoveAll(dir) // as a reset does, lock still held
		held.Close()
	}()
	j, err := knobs.OpenWait(dir, "t", 10*time.Second)
	if err != nil {
		t.Fatalf("OpenWait across the removal: %v", err)
	}
	defer j.Close()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the waiter holds no directory at %s: %v", dir, err)
	}
	if other, err := knobs.Open(dir, "t"); !errors.Is(err, knobs.ErrBusy) {
		if other != nil {
			other.Close()
		}
		t.Fatalf("a second Open after the waiter got the lock: %v, want ErrBusy", err)
	}
	if _, err := knobs.OpenExisting(filepath.Join(t.TempDir(), "gone"), "t"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenExisting on a missing dir: %v", err)
	}
}

// TestJournalDrop: entries of a device replaced by another of the same name
// go without their originals being written onto the new device; only the
// ones release names are restored, and one whose restore fails goes too.
func TestJournalDrop(t *testing.T) {
	dir, ks := memKnobs(t, 4)
	j, err := knobs.Open(filepath.Join(dir, "state"), "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i, k := range ks {
		if err := j.Set(k, []byte(fmt.Sprintf("new%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(ks[0].Log)
	// k2 is "ours to release" and its restore fails; k3 is released fine.
	if err := os.WriteFile(ks[2].Path+".fail", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	release := map[string]bool{ks[2].Key(): true, ks[3].Key(): true}
	rep, err := j.Drop([]string{ks[1].Key(), ks[2].Key(), ks[3].Key()}, release)
	if err != nil {
		t.Fatal(err)
	}
	if j.Len() != 1 {
		t.Errorf("journal has %d entries after Drop, want the first one only", j.Len())
	}
	if len(rep.Failed) != 1 || rep.Failed[0].Key != ks[2].Key() || len(rep.Restored) != 1 || len(rep.Skipped) != 1 {
		t.Errorf("report %+v: want k3 restored, k2 failed, k1 skipped", rep)
	}
	if b, _ := os.ReadFile(ks[1].Path); string(b) != "new1" {
		t.Errorf("k1 = %q: Drop wrote onto it", b)
	}
	log, _ := os.ReadFile(ks[0].Log)
	if want := "k3=orig3\x00\n \n"; string(log) != want {
		t.Errorf("writes %q, want only k3's restore", log)
	}
}

func TestOlderKey(t *testing.T) {
	for in, want := range map[string]string{
		"feature:pid:42@8193:eth0:gro":            "feature:pid:42:eth0:gro",
		"feature:pid:42:eth0:gro":                 "feature:pid:42:eth0:gro",
		"sysfs:lanes-h2:/sys/class/net/x/rps":     "sysfs:lanes-h2:/sys/class/net/x/rps",
		"tcx:pid:7@1:veth1:ingress":               "tcx:pid:7:veth1:ingress",
		"tcx:pid:7@1:veth1:ingress#link_tcx-in_x": "tcx:pid:7:veth1:ingress",
	} {
		if got := knobs.OlderKey(in); got != want {
			t.Errorf("OlderKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// A write that fails never happened: the journal does not keep its knob
// to restore (after a failed apply, a read-only knob lanes never changed
// would fail every reset), and a knob written before keeps its entry and
// the value lanes wrote then.
func TestJournalFailedWriteNotKept(t *testing.T) {
	dir, ks := memKnobs(t, 2)
	j, err := knobs.Open(filepath.Join(dir, "state"), "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Set(ks[1], []byte("new1")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(ks[0].Path+".fail", nil, 0o644)
	os.WriteFile(ks[1].Path+".fail", nil, 0o644)
	if err := j.Set(ks[0], []byte("new0")); err == nil {
		t.Fatal("a failing write succeeded")
	}
	if err := j.Set(ks[1], []byte("newer1")); err == nil {
		t.Fatal("a failing write succeeded")
	}
	ents, err := knobs.ReadEntries(filepath.Join(dir, "state"))
	if err != nil || len(ents) != 1 || ents[0].Key != ks[1].Key() || string(ents[0].Wrote) != "new1" {
		t.Fatalf("journal %+v (%v): want only %s, wrote new1", ents, err, ks[1].Key())
	}
	os.Remove(ks[1].Path + ".fail")
	if _, err := j.Restore(); err != nil {
		t.Fatalf("restore after the failed writes: %v", err)
	}
}

// Restoring a knob that already holds its original writes nothing, so a
// knob recorded but never written (a crash between the two) restores
// even when it cannot be written.
func TestJournalRestoreAtOriginalWritesNothing(t *testing.T) {
	dir, ks := memKnobs(t, 1)
	state := filepath.Join(dir, "state")
	j, err := knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Record(ks[0]); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(ks[0].Path+".fail", nil, 0o644)
	rep, err := j.Restore()
	if err != nil || len(rep.Restored) != 1 {
		t.Fatalf("restore %+v: %v", rep, err)
	}
	if log, _ := os.ReadFile(ks[0].Log); len(log) != 0 {
		t.Errorf("restore wrote %q to a knob at its original", log)
	}
	if knobs.Exists(state) {
		t.Error("journal left behind")
	}
}

// The journal keeps what lanes wrote; a knob someone changed after that
// (irqbalance, tuned, an operator) is reported at restore, and restored.
func TestJournalReportsDrift(t *testing.T) {
	dir, ks := memKnobs(t, 2)
	j, err := knobs.Open(filepath.Join(dir, "state"), "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, k := range ks {
		if err := j.Set(k, []byte("lanes")); err != nil {
			t.Fatal(err)
		}
	}
	if ents := j.Entries(); string(ents[0].Wrote) != "lanes" {
		t.Fatalf("entry %+v does not keep the value written", ents[0])
	}
	os.WriteFile(ks[1].Path, []byte("operator"), 0o644)
	rep, err := j.Restore()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Drift) != 1 || rep.Drift[0].Key != ks[1].Key() || !strings.Contains(rep.Drift[0].Reason, `found "operator" where lanes wrote "lanes"`) {
		t.Errorf("drift %+v: want %s found operator", rep.Drift, ks[1].Key())
	}
	if b, _ := os.ReadFile(ks[1].Path); string(b) != "orig1\x00\n " {
		t.Errorf("drifted knob restored to %q", b)
	}
}

// State files and the state directory are not opened through symlinks:
// a link someone put there would make lanes read, write or remove files
// anywhere.
func TestStateFilesNoFollow(t *testing.T) {
	dir := t.TempDir()
	elsewhere := filepath.Join(dir, "elsewhere")
	os.WriteFile(elsewhere, []byte(`{"version":1,"target":"host","entries":[]}`), 0o644)

	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o755)
	os.Symlink(elsewhere, filepath.Join(state, knobs.JournalFile))
	if j, err := knobs.Open(state, "host"); err == nil {
		j.Close()
		t.Error("a journal symlinked in was opened")
	}

	link := filepath.Join(dir, "link")
	os.Symlink(state, link)
	if j, err := knobs.Open(link, "host"); err == nil {
		j.Close()
		t.Error("a state dir that is a symlink was opened")
	}

	target := filepath.Join(dir, "victim")
	os.WriteFile(target, []byte("keep"), 0o644)
	path := filepath.Join(dir, "file")
	os.Symlink(target, path+".tmp")
	if err := knobs.WriteFileAtomic(path, []byte("x")); err == nil {
		t.Error("wrote through a symlinked temp file")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("the symlink's target was overwritten: %q", b)
	}
	if _, err := knobs.ReadFileNoFollow(filepath.Join(state, knobs.JournalFile)); err == nil {
		t.Error("read through a symlink")
	}
}

// A kernel thread knob keeps the start time of the thread it first read:
// a thread that took its name or index since (a NAPI switched off and on,
// CPUs gone and back) is another thread, whose knob restores nothing.
func TestKthreadIdentity(t *testing.T) {
	k := knobs.Sched("kthreadd", 0)
	if _, err := k.Read(); err != nil {
		t.Skipf("no kthreadd here: %v", err)
	}
	if k.Started == 0 {
		t.Fatal("the first read noted no start time")
	}
	raw, _ := json.Marshal(k)
	var back knobs.KthreadSched
	if err := json.Unmarshal(raw, &back); err != nil || back.Started != k.Started {
		t.Fatalf("journal round trip: %+v (%v)", back, err)
	}
	if _, err := back.Read(); err != nil {
		t.Errorf("the same thread: %v", err)
	}
	back.Started++ // the thread lanes changed, replaced by another
	if err := back.Write([]byte("policy=other prio=0 nice=0")); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("write to a replaced thread: %v, want ErrGone", err)
	}
	if _, err := back.Read(); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("read of a replaced thread: %v, want ErrGone", err)
	}
}

// A runtime writer (an agent) writes a knob only while the journal is the
// one of the apply it works for, and only a knob that apply set: after a
// reset, or a newer apply, its write is refused and changes nothing, so a
// reset is never undone behind its back (the guard once left SCHED_FIFO
// after a reset, and a later apply journaled it as the original).
func TestRuntimeWriteChecksGeneration(t *testing.T) {
	dir, ks := memKnobs(t, 3)
	state := filepath.Join(dir, "state")
	j, err := knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks[:2] {
		if err := j.Set(k, []byte("plan")); err != nil {
			t.Fatal(err)
		}
	}
	gen := knobs.Generation(j.Entries())
	j.Close()

	if err := knobs.RuntimeWrite(state, gen, ks[1], []byte("agent")); err != nil {
		t.Fatalf("write for the current apply: %v", err)
	}
	if ents, _ := knobs.ReadEntries(state); string(ents[1].Wrote) != "agent" {
		t.Errorf("journal does not keep the agent's write: %+v", ents[1])
	}
	if err := knobs.RuntimeWrite(state, gen, ks[2], []byte("agent")); err == nil {
		t.Error("wrote a knob the plan did not set")
	}
	// A concurrent reset: the writer is refused while it runs (busy),
	// and after it (stale).
	j, err = knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	if err := knobs.RuntimeWrite(state, gen, ks[1], []byte("agent")); !errors.Is(err, knobs.ErrBusy) {
		t.Errorf("write during a reset: %v, want busy", err)
	}
	if _, err := j.Restore(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := knobs.RuntimeWrite(state, gen, ks[1], []byte("agent")); !errors.Is(err, knobs.ErrStale) {
		t.Errorf("write after the reset: %v, want stale", err)
	}
	if b, _ := os.ReadFile(ks[1].Path); string(b) != "orig1\x00\n " {
		t.Errorf("after reset and a stale write: %q, want the original", b)
	}
	// A newer apply: another generation.
	j, err = knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	if err := j.Set(ks[1], []byte("plan2")); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := knobs.RuntimeWrite(state, gen, ks[1], []byte("agent")); !errors.Is(err, knobs.ErrStale) {
		t.Errorf("write for an older apply: %v, want stale", err)
	}
	if b, _ := os.ReadFile(ks[1].Path); string(b) != "plan2" {
		t.Errorf("the newer apply's value was overwritten: %q", b)
	}
}
