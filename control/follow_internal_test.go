package control

import (
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/topology"
)

// The follower's pure parts: which knobs it follows, which device a
// change is on (by its target, longest label first: veth1 is not veth10),
// and values compared as the kernel shows them.
func TestFollowPieces(t *testing.T) {
	topo := &topology.Topology{
		NetNS: "h2",
		Veths: []topology.Veth{
			{Device: topology.Device{Name: "veth1", NetNS: "h2", Index: 7}, PeerNetNS: "c1", PeerName: "eth0"},
			{Device: topology.Device{Name: "veth10", NetNS: "h2", Index: 9}, PeerNetNS: "c10", PeerName: "eth0"},
			{Device: topology.Device{Name: "vethx", NetNS: "h2", Index: 11}, PeerNetNS: "unknown"},
		},
		Containers: []topology.Container{
			{NetNS: "c1", Interfaces: []topology.Interface{{Device: topology.Device{Name: "eth0", NetNS: "c1"}, HostVeth: "veth1"}}},
			{NetNS: "c10", Interfaces: []topology.Interface{{Device: topology.Device{Name: "eth0", NetNS: "c10"}, HostVeth: "veth10"}}},
		},
	}
	d := containerDevices(topo)
	for _, c := range []struct {
		target, dev string
		ok          bool
	}{
		{"h2/veth10 tc egress", "h2/veth10", true},
		{"h2/veth1 tc egress", "h2/veth1", true},
		{"h2/veth1 rx-0", "h2/veth1", true},
		{"c10/eth0 rx-0", "c10/eth0", true},
		{"h2/vethx tc egress", "", false}, // peer unknown: no container
		{"h2/vxlan0 rx-0", "", false},
		{"kthread napi/ul2-8193", "", false},
	} {
		dev, ok := d.of(plan.Change{Target: c.target})
		if dev != c.dev || ok != c.ok {
			t.Errorf("%q: on %q (%v), want %q (%v)", c.target, dev, ok, c.dev, c.ok)
		}
	}
	if got := d.iface["h2/veth10"]; got != "c10/eth0" {
		t.Errorf("veth10's container side: %q", got)
	}
	if d.hostIndex("h2", "veth10") != 9 || d.hostIndex("c1", "eth0") != 0 {
		t.Errorf("host indexes: veth10 %d, c1/eth0 %d", d.hostIndex("h2", "veth10"), d.hostIndex("c1", "eth0"))
	}

	rps := knobs.Sysfs("c1", "/sys/class/net/eth0/queues/rx-0/rps_cpus")
	for _, c := range []struct {
		k    knobs.Knob
		want bool
	}{
		{&attach.TCX{NetNS: "h2", Device: "veth1", Direction: "egress"}, true},
		{rps, true},
		{knobs.Sysfs("c1", "/sys/class/net/eth0/queues/rx-0/rps_flow_cnt"), true},
		{knobs.Sysfs("c1", "/sys/class/net/eth0/threaded"), false},
		{knobs.Channels("c1", "eth0"), false},
		{&attach.XDP{NetNS: "h2", Device: "veth1"}, false},
	} {
		if got := followableKnob(c.k); got != c.want {
			t.Errorf("followable %s: %v, want %v", c.k.Key(), got, c.want)
		}
	}
	for _, c := range []struct {
		k    knobs.Knob
		want string
	}{
		{rps, "c1/eth0"},
		{&attach.TCX{NetNS: "h2", Device: "veth1", Direction: "egress"}, "h2/veth1"},
		{knobs.Channels("c1", "eth0"), "c1/eth0"},
		{knobs.Features("c1", "eth0", "tx-tcp-segmentation"), "c1/eth0"},
		{knobs.QueueAffinity("c1", "eth0", 1), "c1/eth0"},
		{knobs.Sched("cpumap/1/map:7", 0), ""},
		{knobs.ProcSys("", "/proc/sys/net/core/netdev_budget"), ""},
	} {
		got, _ := entryDevice(c.k)
		if got != c.want {
			t.Errorf("device of %s: %q, want %q", c.k.Key(), got, c.want)
		}
	}
	for _, c := range []struct {
		cur, want string
		same      bool
	}{
		{"00000000,00000003\n", "3", true},
		{"3\n", "3", true},
		{"1\n", "3", false},
		{"0\n", "0", true},
	} {
		if got := sameValue(rps, []byte(c.cur), []byte(c.want)); got != c.same {
			t.Errorf("rps_cpus %q against %q: same=%v", c.cur, c.want, got)
		}
	}
	tcx := &attach.TCX{}
	if !sameValue(tcx, []byte("attached"), []byte("attached")) || sameValue(tcx, []byte(""), []byte("attached")) {
		t.Error("tcx values compared wrongly")
	}
	st := FollowStatus{Found: 3, Steered: 3, Covered: 2, Waiting: "x", Refused: "y"}
	if got := strings.Join(st.Summary(), "|"); got != "containers: 2 of the 3 interfaces the plan steers are covered (3 found)|containers: waiting: x|containers: NOT FOLLOWED: y" {
		t.Errorf("summary %q", got)
	}
}

// TestFollowMessages: the refusal's fix is the whole apply command (mode,
// namespace, cores, settings, a state dir other than the default), and
// lists stay one short line on a host with hundreds of containers.
func TestFollowMessages(t *testing.T) {
	st := &State{Mode: "falcon", NetNS: "h2", CPUs: "0-1", Params: map[string]string{"threshold": "70", "x-park": "false"}}
	if got, want := applyCommand(st, DefaultStateDir), "lanes apply --mode falcon --netns h2 --cpus 0-1 --set threshold=70 --set x-park=false"; got != want {
		t.Errorf("applyCommand = %q, want %q", got, want)
	}
	if got, want := applyCommand(&State{Mode: "rps"}, "/tmp/s"), "lanes apply --mode rps --state-dir /tmp/s"; got != want {
		t.Errorf("applyCommand = %q, want %q", got, want)
	}
	if got := listSome([]string{"a", "b"}); got != "a, b" {
		t.Errorf("listSome = %q", got)
	}
	if got := listSome([]string{"a", "b", "c", "d", "e"}); got != "a, b, c and 2 more" {
		t.Errorf("listSome = %q", got)
	}
}

// TestReplacedDevice: a label is another device when its ident changed
// since the journal was last settled; a device not seen before, or gone,
// is not "replaced".
func TestReplacedDevice(t *testing.T) {
	seen := map[string]string{"h2/veth1": "7/3", "h2/veth2": "8/4"}
	now := map[string]string{"h2/veth1": "12/13", "h2/veth2": "8/4", "h2/veth3": "14/15"}
	for dev, want := range map[string]bool{"h2/veth1": true, "h2/veth2": false, "h2/veth3": false, "h2/veth9": false} {
		if got := replacedDevice(seen, now, dev); got != want {
			t.Errorf("replacedDevice(%s) = %v, want %v", dev, got, want)
		}
	}
}

// TestApplyCommandQuotes: the command a refusal gives can be pasted as is.
func TestApplyCommandQuotes(t *testing.T) {
	st := &State{Mode: "prism", NetNS: "/var/run/netns/a b", CPUs: "0-1", Params: map[string]string{"cpu": "1", "x": "it's"}}
	got := applyCommand(st, "/tmp/state dir")
	want := `lanes apply --mode prism --netns '/var/run/netns/a b' --cpus 0-1 --set cpu=1 --set 'x=it'\''s' --state-dir '/tmp/state dir'`
	if got != want {
		t.Errorf("applyCommand:\n got %s\nwant %s", got, want)
	}
}
