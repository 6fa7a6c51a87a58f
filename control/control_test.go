package control

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
	"github.com/vishvananda/netlink"
)

// snapshot reads, byte for byte, every receive-side file of every device of
// a namespace's overlay: what any mode might touch.
func snapshot(t *testing.T, ns string) map[string][]byte {
	t.Helper()
	topo, err := topology.Discover(ns)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, d := range topo.AllDevices() {
		paths := []string{"/sys/class/net/" + d.Name + "/threaded"}
		for _, q := range d.RxQueues {
			paths = append(paths, d.QueuePath(q.Index)+"/rps_cpus", d.QueuePath(q.Index)+"/rps_flow_cnt")
		}
		for _, p := range paths {
			k := knobs.Sysfs(d.NetNS, p)
			b, err := k.Read()
			if err != nil {
				t.Fatal(err)
			}
			out[k.Key()] = b
		}
	}
	return out
}

func sameSnapshot(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || !bytes.Equal(g, w) {
			t.Errorf("%s: %s = %q, want %q", what, k, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d knobs, want %d", what, len(got), len(want))
	}
}

// rpsDevices returns the rps_cpus knob keys the rps mode must set.
func rpsKeys(f *topotest.Fixture, h topotest.Host) []string {
	k := func(ns, dev string) string {
		return knobs.Sysfs(ns, "/sys/class/net/"+dev+"/queues/rx-0/rps_cpus").Key()
	}
	keys := []string{k(h.NetNS, h.VXLAN)}
	for _, c := range h.Containers {
		keys = append(keys, k(h.NetNS, c.HostVeth), k(c.NetNS, c.Veth))
	}
	return keys
}

func noState(t *testing.T, stateDir string) {
	t.Helper()
	ents, _ := os.ReadDir(stateDir)
	if len(ents) != 0 {
		t.Errorf("state left in %s: %v", stateDir, ents)
	}
}

func TestApplyRPSThenReset(t *testing.T) {
	f := topotest.New(t, topotest.Options{})
	h := f.Hosts[1]
	stateDir := t.TempDir()
	before := snapshot(t, h.NetNS)

	st, err := Apply(Options{Mode: "rps", NetNS: h.NetNS, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	// The RPS maps, and the namespace's default map for devices to come.
	changes := len(rpsKeys(f, h)) + 1
	if st.Phase != Applied || st.Plan.Changes != changes {
		t.Errorf("state %+v: want applied with %d changes", st, changes)
	}
	online, _ := cpuset.Online()
	after := snapshot(t, h.NetNS)
	for _, key := range rpsKeys(f, h) {
		cpus, err := cpuset.ParseMask(string(after[key]))
		if err != nil || cpuset.FormatList(cpus) != cpuset.FormatList(online) {
			t.Errorf("%s = %q, want all online cores %v", key, after[key], online)
		}
	}
	if bytes.Equal(after[rpsKeys(f, h)[0]], before[rpsKeys(f, h)[0]]) {
		t.Fatal("rps changed nothing: the test proves nothing")
	}
	// The underlay is not an overlay receive device: rps leaves it alone.
	ul := knobs.Sysfs(h.NetNS, "/sys/class/net/"+h.Underlay+"/queues/rx-0/rps_cpus").Key()
	if !bytes.Equal(after[ul], before[ul]) {
		t.Errorf("rps changed the underlay: %s = %q", ul, after[ul])
	}

	rep, err := Status(StatusOptions{NetNS: h.NetNS, StateDir: stateDir, Sample: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "rps" || rep.Journaled != changes || rep.Topology == nil || len(rep.Cores) != len(online) {
		t.Errorf("status: mode %q journaled %d topology %v cores %d", rep.Mode, rep.Journaled, rep.Topology != nil, len(rep.Cores))
	}
	for _, c := range rep.Cores {
		if len(c.RPS) != len(rpsKeys(f, h)) {
			t.Errorf("core %d: %d RPS queues listed, want %d", c.CPU, len(c.RPS), len(rpsKeys(f, h)))
		}
	}

	res, err := Reset(h.NetNS, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if res.Nothing || res.Mode != "rps" || len(res.Report.Restored) != changes {
		t.Errorf("reset result %+v", res)
	}
	sameSnapshot(t, "after reset", snapshot(t, h.NetNS), before)
	noState(t, stateDir)

	res, err = Reset(h.NetNS, stateDir)
	if err != nil || !res.Nothing {
		t.Errorf("second reset: %+v, %v; want nothing to restore", res, err)
	}
}

// rps sets net.core.rps_default_mask in the target namespace, journaled:
// a veth made there while it is applied starts with the plan's RPS map,
// and reset puts the namespace's default back, so a veth made after it
// starts as before.
func TestRPSDefaultMask(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[1]
	stateDir := t.TempDir()
	knob := knobs.Sysctl(h.NetNS, "net.core.rps_default_mask")
	orig, err := knob.Read()
	if err != nil {
		t.Skipf("no rps_default_mask in this kernel's namespaces: %v", err)
	}
	online, _ := cpuset.Online()
	mask := func(b []byte) string {
		cpus, err := cpuset.ParseMask(string(b))
		if err != nil {
			t.Fatalf("mask %q: %v", b, err)
		}
		return cpuset.FormatList(cpus)
	}
	veth := func(name string) string {
		t.Helper()
		var rps []byte
		err := netnsx.DoSysfs(h.NetNS, func() error {
			la := netlink.NewLinkAttrs()
			la.Name = name
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "p"}); err != nil {
				return err
			}
			defer netlink.LinkDel(&netlink.Veth{LinkAttrs: la})
			var err error
			rps, err = os.ReadFile("/sys/class/net/" + name + "/queues/rx-0/rps_cpus")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return mask(rps)
	}
	before := veth("lnsdm0")

	if _, err := Apply(Options{Mode: "rps", NetNS: h.NetNS, StateDir: stateDir}); err != nil {
		t.Fatal(err)
	}
	ents, err := knobs.ReadEntries(Dir(stateDir, h.NetNS))
	if err != nil {
		t.Fatal(err)
	}
	journaled := false
	for _, e := range ents {
		if e.Key == knob.Key() {
			journaled = bytes.Equal(e.Original, orig)
		}
	}
	if !journaled {
		t.Errorf("%s not journaled with its original %q", knob.Key(), orig)
	}
	if got, _ := knob.Read(); mask(got) != cpuset.FormatList(online) {
		t.Errorf("rps_default_mask while applied: %q, want cores %v", got, online)
	}
	if got := veth("lnsdm1"); got != cpuset.FormatList(online) {
		t.Errorf("a veth made while rps is applied has RPS map %q, want the plan's %v", got, online)
	}

	if _, err := Reset(h.NetNS, stateDir); err != nil {
		t.Fatal(err)
	}
	if got, _ := knob.Read(); !bytes.Equal(got, orig) {
		t.Errorf("rps_default_mask after reset: %q, want %q", got, orig)
	}
	if got := veth("lnsdm2"); got != before {
		t.Errorf("a veth made after reset has RPS map %q, want %q as before", got, before)
	}
	noState(t, stateDir)
}

func TestModeSwitchRestoresFirst(t *testing.T) {
	f := topotest.New(t, topotest.Options{Layout: topotest.Flannel, Containers: 1})
	h := f.Hosts[0]
	stateDir := t.TempDir()
	before := snapshot(t, h.NetNS)
	online, _ := cpuset.Online()
	one := strconv.Itoa(online[0])

	if _, err := Apply(Options{Mode: "rps", NetNS: h.NetNS, CPUs: one, StateDir: stateDir}); err != nil {
		t.Fatal(err)
	}
	// Re-applying with other cores must keep the true originals.
	if _, err := Apply(Options{Mode: "rps", NetNS: h.NetNS, StateDir: stateDir}); err != nil {
		t.Fatal(err)
	}
	st, err := Apply(Options{Mode: "vanilla", NetNS: h.NetNS, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != "vanilla" || st.Plan.Changes != 0 {
		t.Errorf("vanilla state %+v", st)
	}
	sameSnapshot(t, "after vanilla", snapshot(t, h.NetNS), before)
	if knobs.Exists(Dir(stateDir, h.NetNS)) {
		t.Error("journal left after vanilla")
	}
	if got, _ := ReadState(Dir(stateDir, h.NetNS)); got == nil || got.Mode != "vanilla" {
		t.Errorf("state after vanilla: %+v", got)
	}
	if res, err := Reset(h.NetNS, stateDir); err != nil || !res.Nothing {
		t.Errorf("reset after vanilla: %+v, %v", res, err)
	}
	noState(t, stateDir)
}

const (
	crashEnvNetNS = "LANES_CONTROL_CRASH_NETNS"
	crashEnvDir   = "LANES_CONTROL_CRASH_DIR"
	crashEnvAfter = "LANES_CONTROL_CRASH_AFTER"
)

// TestCrashHelper is the child of TestKilledApplyRecovers: it applies rps
// and SIGKILLs itself once some changes are in.
func TestCrashHelper(t *testing.T) {
	ns := os.Getenv(crashEnvNetNS)
	if ns == "" {
		t.Skip("helper process for TestKilledApplyRecovers")
	}
	after, _ := strconv.Atoi(os.Getenv(crashEnvAfter))
	testAfterChange = func(i int) {
		if i == after {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	Apply(Options{Mode: "rps", NetNS: ns, StateDir: os.Getenv(crashEnvDir)})
	t.Fatal("helper was not killed")
}

func TestKilledApplyRecovers(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 2})
	h := f.Hosts[1]
	stateDir := t.TempDir()
	before := snapshot(t, h.NetNS)
	after := 2 // three of five changes in when the process dies

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnvNetNS+"="+h.NetNS, crashEnvDir+"="+stateDir, crashEnvAfter+"="+strconv.Itoa(after))
	out, err := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
	}
	dir := Dir(stateDir, h.NetNS)
	st, err := ReadState(dir)
	if err != nil || st == nil || st.Phase != Applying {
		t.Errorf("state after the kill: %+v, %v; want phase applying", st, err)
	}
	mid := snapshot(t, h.NetNS)
	changed := 0
	for k := range before {
		if !bytes.Equal(mid[k], before[k]) {
			changed++
		}
	}
	if changed != after+1 {
		t.Errorf("%d knobs changed when the apply died, want %d", changed, after+1)
	}

	res, err := Reset(h.NetNS, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if res.Nothing || len(res.Report.Restored) != after+1 {
		t.Errorf("reset after kill: %+v", res)
	}
	sameSnapshot(t, "after reset", snapshot(t, h.NetNS), before)
	noState(t, stateDir)
}

func TestApplyRefusesNoOverlay(t *testing.T) {
	testenv.Root(t)
	ns := topotest.Namespace(t, topotest.NewPrefix()+"-bare")
	stateDir := t.TempDir()
	for _, mode := range []string{"rps", "vanilla"} {
		_, err := Apply(Options{Mode: mode, NetNS: ns, StateDir: stateDir})
		if !errors.Is(err, topology.ErrNoOverlay) {
			t.Errorf("apply %s on a bare namespace: %v, want no overlay", mode, err)
		}
	}
	noState(t, stateDir)
}

func TestApplyValidatesFirst(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[0]
	stateDir := t.TempDir()
	before := snapshot(t, h.NetNS)
	online, _ := cpuset.Online()
	offline := strconv.Itoa(online[len(online)-1] + 1)
	cases := []struct {
		opts Options
		want string
	}{
		{Options{Mode: "rps", CPUs: "abc"}, "is not a core number"},
		{Options{Mode: "rps", CPUs: "1-0"}, "runs backwards"},
		{Options{Mode: "rps", CPUs: offline}, "core " + offline + " is not online: this machine has cores"},
		{Options{Mode: "rps", CPUs: "0-100000"}, "beyond any machine"},
		{Options{Mode: "turbo"}, `unknown mode "turbo": use one of`},
		{Options{Mode: ""}, "no mode given"},
	}
	for _, tc := range cases {
		tc.opts.NetNS, tc.opts.StateDir = h.NetNS, stateDir
		_, err := Apply(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Apply(%+v) = %v, want one line containing %q", tc.opts, err, tc.want)
		}
	}
	if _, err := Apply(Options{Mode: "rps", NetNS: "lanes-no-such-ns", StateDir: stateDir}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("apply to a missing namespace: %v", err)
	}
	sameSnapshot(t, "after rejected applies", snapshot(t, h.NetNS), before)
	noState(t, stateDir)
}

// An apply that cannot have the target's journal (another lanes process
// holds it) leaves nothing of its own in the state directory: no agent
// lock that would make it a target, listed by status and reset --all.
func TestApplyBusyLeavesNothing(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[0]
	stateDir := t.TempDir()
	dir := Dir(stateDir, h.NetNS)
	j, err := knobs.Open(dir, Target(h.NetNS))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if isTargetDir(dir) {
		t.Fatalf("premise: %s is no target before the apply", dir)
	}
	if _, err := Apply(Options{Mode: "rps", NetNS: h.NetNS, StateDir: stateDir}); !errors.Is(err, knobs.ErrBusy) {
		t.Fatalf("premise: apply with the journal held: %v, want busy", err)
	}
	if ents, _ := os.ReadDir(dir); isTargetDir(dir) {
		t.Errorf("the busy apply left %v in %s: a target now", ents, dir)
	}
}

// A former lanes kept a namespace's state under its flat name, which
// Target no longer gives a name with a '.' (nor one whose flat form reads
// back as another namespace). Where the state file there names the
// namespace, reset restores it and status reads it; with no state file to
// say whose it is, both name the directory and reset --all, which
// restores it.
func TestResetFindsLegacyState(t *testing.T) {
	testenv.Root(t)
	ns := topotest.Namespace(t, topotest.NewPrefix()+".old")
	stateDir := t.TempDir()
	old := filepath.Join(stateDir, legacyTarget(ns))
	if old == Dir(stateDir, ns) {
		t.Fatalf("premise: %s has its flat name for a target", ns)
	}
	knob := knobs.Sysctl(ns, "net.core.somaxconn")
	before, err := knob.Read()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { knob.Write(before) })
	journal := func() {
		t.Helper()
		j, err := knobs.Open(old, legacyTarget(ns))
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		if err := j.Set(knob, []byte("1111")); err != nil {
			t.Fatal(err)
		}
	}
	status := func() *StatusReport {
		t.Helper()
		s, err := Status(StatusOptions{NetNS: ns, StateDir: stateDir, Sample: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	restored := func(what string) {
		t.Helper()
		if v, err := knob.Read(); err != nil || !bytes.Equal(v, before) {
			t.Errorf("%s: somaxconn %q, was %q (%v)", what, v, before, err)
		}
		noState(t, stateDir)
	}

	journal()
	if err := writeState(old, &State{Mode: "rps", NetNS: ns, Target: legacyTarget(ns), Phase: Applied}); err != nil {
		t.Fatal(err)
	}
	if s := status(); s.Mode != "rps" || s.Journaled != 1 {
		t.Errorf("status: mode %s, %d journaled, want rps and 1 from %s", s.Mode, s.Journaled, old)
	}
	res, err := Reset(ns, stateDir)
	if err != nil || res.Nothing || res.Report == nil || len(res.Report.Restored) != 1 {
		t.Errorf("reset: %+v, %v, want the knob under %s restored", res, err, old)
	}
	restored("after reset")

	journal()
	hint := func(what, s string) {
		t.Helper()
		if !strings.Contains(s, filepath.Base(old)) || !strings.Contains(s, "lanes reset --all") {
			t.Errorf("%s %q: want the old name %s and lanes reset --all", what, s, filepath.Base(old))
		}
	}
	hint("status", status().OldState)
	if _, err := Reset(ns, stateDir); err == nil {
		t.Errorf("reset with the state's owner unknown: no error, want the old name and reset --all")
	} else {
		hint("reset", err.Error())
	}
	if _, err := ResetAll(stateDir); err != nil {
		t.Errorf("reset --all: %v", err)
	}
	restored("after reset --all")
}

func TestResetAll(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	stateDir := t.TempDir()
	var before []map[string][]byte
	for _, h := range f.Hosts {
		before = append(before, snapshot(t, h.NetNS))
		if _, err := Apply(Options{Mode: "rps", NetNS: h.NetNS, StateDir: stateDir}); err != nil {
			t.Fatal(err)
		}
	}
	// The testbed keeps its records next to the targets; they are not one.
	records := filepath.Join(stateDir, "testbed")
	if err := os.Mkdir(records, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(records, "lanes.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := ResetAll(stateDir)
	if err != nil || len(res) != 2 {
		t.Fatalf("reset all: %d results (want the 2 hosts, not the testbed's records), %v", len(res), err)
	}
	for i, h := range f.Hosts {
		sameSnapshot(t, "after reset --all", snapshot(t, h.NetNS), before[i])
	}
	if _, err := os.Stat(filepath.Join(records, "lanes.json")); err != nil {
		t.Errorf("the testbed's records: %v", err)
	}
	os.RemoveAll(records)
	noState(t, stateDir)
}

func TestTargetNames(t *testing.T) {
	for ns, want := range map[string]string{
		"":                            "host",
		"lanes-h1":                    "lanes-h1",
		"/var/run/docker/netns/1-abc": "var_run_docker_netns_1-abc",
		"pid:42":                      "pid_42",
		"pid:42@8193":                 "pid_42", // the same namespace, checked by its cookie
	} {
		if got := Target(ns); got != want {
			t.Errorf("Target(%q) = %q, want %q", ns, got, want)
		}
	}
	if got := Dir("", "x"); got != filepath.Join(DefaultStateDir, "x") {
		t.Errorf("default dir %q", got)
	}
}
