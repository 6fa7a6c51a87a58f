package falcon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/testenv"
)

func TestZeroMask(t *testing.T) {
	for in, want := range map[string]bool{
		"0\n": true, "00000000,00000000\n": true, "0,0": true,
		"1\n": false, "00000000,00000002\n": false, "": false, "\n": false,
	} {
		if got := zeroMask([]byte(in)); got != want {
			t.Errorf("zeroMask(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestParkOff: the options under which the agent never parks, each with
// its reason; Falcon's defaults on a veth underlay (split=auto off) park.
func TestParkOff(t *testing.T) {
	base := Defaults()
	base.Split = false
	if why := parkOff(base); why != "" {
		t.Fatalf("defaults without split: %q, want parking allowed", why)
	}
	for name, c := range map[string]struct {
		set  func(*Options)
		want string
	}{
		"x-park=false":  {func(o *Options) { o.Park = false }, "x-park=false"},
		"spread=always": {func(o *Options) { o.Spread = SpreadAlways }, "never rest at home"},
		"balance=false": {func(o *Options) { o.Balance = false }, "never rest at home"},
		"split":         {func(o *Options) { o.Split = true }, "XDP"},
		"split=rps":     {func(o *Options) { o.SplitRPS = true }, "split=rps"},
		"prio":          {func(o *Options) { o.Prio = true }, "prio"},
		"x-bare=false":  {func(o *Options) { o.Bare = false }, "bare path"},
		"x-stay=queued": {func(o *Options) { o.Stay = StayQueued }, "bare path"},
	} {
		o := base
		c.set(&o)
		if why := parkOff(o); !strings.Contains(why, c.want) {
			t.Errorf("%s: parkOff = %q, want it to say %q", name, why, c.want)
		}
	}
}

// TestParkableRefuses: a journal with an XDP program, a program parking
// does not know, or an RPS map that was set before lanes is not parked.
func TestParkableRefuses(t *testing.T) {
	entry := func(k knobs.Knob, orig string) knobs.Entry {
		raw, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		return knobs.Entry{Kind: k.Kind(), Key: k.Key(), Knob: raw, Original: []byte(orig)}
	}
	rps := knobs.Sysfs("ns", "/sys/class/net/vxlan0/queues/rx-0/rps_cpus")
	for name, c := range map[string]struct {
		ents []knobs.Entry
		want string
	}{
		"xdp":       {[]knobs.Entry{entry(&attach.XDP{Device: "eth0", Prog: "/p/" + steer.PinXDP}, "")}, "XDP"},
		"other tcx": {[]knobs.Entry{entry(&attach.TCX{Device: "veth1", Direction: "egress", Prog: "/p/" + steer.PinTCVethClass}, "")}, "not one parking"},
		"rps set":   {[]knobs.Entry{entry(rps, "2\n")}, "before lanes"},
		"nothing":   {[]knobs.Entry{entry(knobs.Sysfs("ns", "/sys/class/net/vxlan0/threaded"), "0\n")}, "nothing on the path"},
	} {
		ks, why := parkable(c.ents)
		if ks != nil || !strings.Contains(why, c.want) {
			t.Errorf("%s: parkable = %d knobs, %q; want none because %q", name, len(ks), why, c.want)
		}
	}
}

// TestParkableSkipsGone: an RPS map on a device that is gone (a container
// that went, which the follower has not let go of yet) is left out, and
// parking stays possible for the rest; with nothing else, nothing parks.
// The knobs are only read.
func TestParkableSkipsGone(t *testing.T) {
	testenv.Root(t) // reading a knob enters the host's mount namespace
	entry := func(k knobs.Knob) knobs.Entry {
		raw, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		return knobs.Entry{Kind: k.Kind(), Key: k.Key(), Knob: raw, Original: []byte("0\n")}
	}
	live := entry(knobs.Sysfs("", "/sys/class/net/lo/queues/rx-0/rps_cpus"))
	gone := entry(knobs.Sysfs("", "/sys/class/net/lanes-gone0/queues/rx-0/rps_cpus"))
	ks, why := parkable([]knobs.Entry{gone, live})
	if why != "" || len(ks) != 1 || ks[0].k.Key() != live.Key {
		t.Errorf("parkable with a gone device: %d knobs, %q; want only %s", len(ks), why, live.Key)
	}
	if ks, why := parkable([]knobs.Entry{gone}); ks != nil || !strings.Contains(why, "nothing on the path") {
		t.Errorf("parkable with only a gone device: %d knobs, %q", len(ks), why)
	}
}

// TestParkFileOfAnotherApply: a parked file left by an agent of an
// earlier apply (the target was applied again since) is stale: the new
// agent is not parked and removes it; a file of the same apply means
// parked. Nothing is written to the kernel (the journal's one knob is
// only read).
func TestParkFileOfAnotherApply(t *testing.T) {
	dir, gen := testJournal(t)
	o := Defaults()
	o.Split = false
	path := filepath.Join(dir, plan.AgentStateFile)
	for _, c := range []struct {
		gen        string
		wantParked bool
	}{{"an earlier apply", false}, {gen, true}} {
		b, _ := json.Marshal(parkFile{Gen: c.gen, Knobs: []parkKnob{}})
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := newParker(o, dir)
		if err != nil {
			t.Fatal(err)
		}
		_, statErr := os.Stat(path)
		if p.parked != c.wantParked || os.IsNotExist(statErr) == c.wantParked {
			t.Errorf("file of gen %q: parked=%v, file kept=%v; want parked=%v and the file kept only then", c.gen, p.parked, statErr == nil, c.wantParked)
		}
	}
}

// recKnob records what was written to it, in a log shared by all.
type recKnob struct {
	name string
	log  *[]string
}

func (k *recKnob) Kind() string          { return "test" }
func (k *recKnob) Key() string           { return "test:" + k.name }
func (k *recKnob) Read() ([]byte, error) { return nil, nil }
func (k *recKnob) Write(v []byte) error {
	*k.log = append(*k.log, k.name+"="+string(v))
	return nil
}

// TestParkSteps: parking writes the maps, then the programs; unparking
// puts the programs back, waits the drain time, then the maps, and only
// then says it is done; after a reset (the journal gone) nothing is
// written and parking turns off.
func TestParkSteps(t *testing.T) {
	dir, gen := testJournal(t)
	var log []string
	p := &parker{dir: dir, path: filepath.Join(dir, plan.AgentStateFile), gen: gen, drain: 20 * time.Millisecond,
		knobs: []parkKnob{
			{Kind: attach.KindTCX, Plan: []byte("attached"), Off: []byte(""), k: &recKnob{"prog", &log}},
			{Kind: "sysfs", Plan: []byte("3"), Off: []byte("0"), k: &recKnob{"map", &log}},
		}}
	want := func(what string, w ...string) {
		t.Helper()
		if strings.Join(log, " ") != strings.Join(w, " ") {
			t.Errorf("%s: wrote %v, want %v", what, log, w)
		}
		log = nil
	}
	if err := p.park(); err != nil || !p.parked {
		t.Fatalf("park: %v, parked=%v", err, p.parked)
	}
	want("park", "map=0", "prog=")
	if _, err := os.Stat(p.path); err != nil {
		t.Errorf("parked without the file: %v", err)
	}
	t0 := time.Now()
	for _, step := range []struct {
		at   time.Duration
		done bool
		w    []string
	}{
		{0, false, []string{"prog=attached"}},
		{10 * time.Millisecond, false, nil},
		{20 * time.Millisecond, true, []string{"map=3"}},
	} {
		done, err := p.unpark(t0.Add(step.at))
		if err != nil || done != step.done {
			t.Fatalf("unpark at +%v: done=%v, %v; want done=%v", step.at, done, err, step.done)
		}
		want(fmt.Sprintf("unpark at +%v", step.at), step.w...)
	}
	if _, err := os.Stat(p.path); !os.IsNotExist(err) {
		t.Errorf("unparked, file still there: %v", err)
	}

	// Parked again, then reset: the agent writes nothing more.
	if err := p.park(); err != nil {
		t.Fatal(err)
	}
	log = nil
	os.Remove(filepath.Join(dir, knobs.JournalFile))
	if done, err := p.unpark(time.Now()); err != nil || !done || p.off == "" {
		t.Errorf("unpark after reset: done=%v, %v, off=%q; want done, parking off", done, err, p.off)
	}
	want("after reset")
}

// testJournal makes a journal of one apply in a temporary state
// directory (its one knob only read, never written) and returns the
// directory and the apply's generation.
func testJournal(t *testing.T) (dir, gen string) {
	t.Helper()
	dir = t.TempDir()
	j, err := knobs.Open(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Record(knobs.Sysfs("", "/sys/class/net/lo/queues/rx-0/rps_cpus")); err != nil {
		t.Skip("no rps_cpus on lo:", err)
	}
	j.Close()
	ents, err := knobs.ReadEntries(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, knobs.Generation(ents)
}
