package falcon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/steer"
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
		"park=false":    {func(o *Options) { o.Park = false }, "park=false"},
		"spread=always": {func(o *Options) { o.Spread = SpreadAlways }, "never rest at home"},
		"balance=false": {func(o *Options) { o.Balance = false }, "never rest at home"},
		"split":         {func(o *Options) { o.Split = true }, "XDP"},
		"split=rps":     {func(o *Options) { o.SplitRPS = true }, "split=rps"},
		"prio":          {func(o *Options) { o.Prio = true }, "prio"},
		"bare=false":    {func(o *Options) { o.Bare = false }, "bare path"},
		"stay=queued":   {func(o *Options) { o.Stay = StayQueued }, "bare path"},
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

// TestParkFileOfAnotherApply: a parked file left by an agent of an
// earlier apply (the target was applied again since) is stale: the new
// agent is not parked and removes it; a file of the same apply means
// parked. Nothing is written to the kernel (the journal's one knob is
// only read).
func TestParkFileOfAnotherApply(t *testing.T) {
	dir := t.TempDir()
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
	o := Defaults()
	o.Split = false
	path := filepath.Join(dir, plan.AgentStateFile)
	for _, c := range []struct {
		gen        string
		wantParked bool
	}{{"an earlier apply", false}, {journalGen(ents), true}} {
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
