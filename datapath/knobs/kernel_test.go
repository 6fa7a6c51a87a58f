package knobs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
)

// change is a knob, the value the test writes, and its value before.
type change struct {
	knob  knobs.Knob
	value string
	orig  []byte
}

// kernelChanges builds a fixture and lists one change of every knob kind on
// it: RPS maps in a host and a container namespace, threaded NAPI, a /proc/sys
// setting inside a namespace, and NAPI kernel threads' affinity and
// scheduling (a veth's thread and a VXLAN GRO cell's, which shares its name
// with its siblings).
func kernelChanges(t *testing.T) (*topotest.Fixture, []change) {
	t.Helper()
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[1]
	c := h.Containers[0]
	// Threads exist only while NAPI is threaded; make them before the
	// journal so that their own settings are what gets journaled.
	for _, k := range []knobs.Knob{
		knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Veth+"/threaded"),
		knobs.Sysfs(h.NetNS, "/sys/class/net/"+h.VXLAN+"/threaded"),
	} {
		if err := k.Write([]byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	topo, err := topology.Discover(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	eth0 := topo.Containers[0].Interfaces[0]
	vx := topo.VXLANs[0]
	if len(eth0.NAPIThreads) != 1 || len(vx.NAPIThreads) < 2 {
		t.Fatalf("NAPI threads: eth0 %+v, vxlan %+v", eth0.NAPIThreads, vx.NAPIThreads)
	}
	online, err := cpuset.Online()
	if err != nil {
		t.Fatal(err)
	}
	mask := cpuset.FormatMask(online)
	last := strconv.Itoa(online[len(online)-1])
	q := func(dev string) string { return "/sys/class/net/" + dev + "/queues/rx-0/" }
	eth0T, gro1 := eth0.NAPIThreads[0], vx.NAPIThreads[1]
	chs := []change{
		{knob: knobs.Sysfs(h.NetNS, q(h.VXLAN)+"rps_cpus"), value: mask},
		{knob: knobs.Sysfs(h.NetNS, q(c.HostVeth)+"rps_cpus"), value: mask},
		{knob: knobs.Sysfs(c.NetNS, q(c.Veth)+"rps_cpus"), value: mask},
		{knob: knobs.Sysfs(c.NetNS, q(c.Veth)+"rps_flow_cnt"), value: "256"},
		{knob: knobs.Sysfs(h.NetNS, "/sys/class/net/"+c.HostVeth+"/threaded"), value: "1"},
		{knob: knobs.ProcSys(h.NetNS, "/proc/sys/net/ipv4/conf/"+c.HostVeth+"/rp_filter"), value: "2"},
		{knob: knobs.Affinity(eth0T.Comm, eth0T.Index), value: last},
		{knob: knobs.Sched(eth0T.Comm, eth0T.Index), value: "policy=fifo prio=10 nice=0"},
		{knob: knobs.Affinity(gro1.Comm, gro1.Index), value: last},
		{knob: knobs.Sched(gro1.Comm, gro1.Index), value: "policy=rr prio=5 nice=0"},
		// Namespaces by path too, as Docker's are named.
		{knob: knobs.Feature("/run/netns/"+h.NetNS, c.HostVeth, ethtool.GRO), value: "off"}, // topotest turned it on
		{knob: knobs.Features("/run/netns/"+h.NetNS, c.HostVeth, knobs.TSOFeatures...),
			value: "tx-tcp-segmentation=on tx-tcp6-segmentation=off tx-tcp-ecn-segmentation=off tx-tcp-mangleid-segmentation=on"},
		{knob: knobs.Channels("/run/netns/"+h.NetNS, c.HostVeth), value: "rx=1 tx=2"},
	}
	for i := range chs {
		b, err := chs[i].knob.Read()
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(b)) == chs[i].value {
			t.Fatalf("%s is %q already: the test would prove nothing", chs[i].knob.Key(), b)
		}
		chs[i].orig = b
	}
	return f, chs
}

func checkChanged(t *testing.T, chs []change) {
	t.Helper()
	for _, c := range chs {
		b, err := c.knob.Read()
		if err != nil {
			t.Fatal(err)
		}
		got := strings.TrimSpace(string(b))
		want := c.value
		if m, err := cpuset.ParseMask(got); err == nil && strings.HasSuffix(c.knob.Key(), "rps_cpus") {
			got = cpuset.FormatMask(m)
		}
		if got != want {
			t.Errorf("after Set, %s = %q, want %q", c.knob.Key(), got, want)
		}
	}
}

func checkRestored(t *testing.T, chs []change) {
	t.Helper()
	for _, c := range chs {
		b, err := c.knob.Read()
		if err != nil {
			t.Errorf("%s: %v", c.knob.Key(), err)
			continue
		}
		if !bytes.Equal(b, c.orig) {
			t.Errorf("after restore, %s = %q, want %q", c.knob.Key(), b, c.orig)
		}
	}
}

func TestJournalRoundTripKernel(t *testing.T) {
	_, chs := kernelChanges(t)
	state := filepath.Join(t.TempDir(), "state")
	j, err := knobs.Open(state, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, c := range chs {
		if err := j.Set(c.knob, []byte(c.value)); err != nil {
			t.Fatal(err)
		}
	}
	checkChanged(t, chs)
	rep, err := j.Restore()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Restored) != len(chs) {
		t.Errorf("restored %d of %d knobs: %+v", len(rep.Restored), len(chs), rep)
	}
	checkRestored(t, chs)
	if knobs.Exists(state) {
		t.Error("journal left behind")
	}
}

const (
	crashEnvDir   = "LANES_KNOBS_CRASH_DIR"
	crashEnvKnobs = "LANES_KNOBS_CRASH_KNOBS"
	crashEnvAt    = "LANES_KNOBS_CRASH_AT"
)

type crashKnob struct {
	Kind  string          `json:"kind"`
	Knob  json.RawMessage `json:"knob"`
	Value string          `json:"value"`
}

// TestCrashHelper is the child of TestJournalKilledMidApply: it sets knobs
// and SIGKILLs itself between journaling knob number AT and writing it.
func TestCrashHelper(t *testing.T) {
	dir := os.Getenv(crashEnvDir)
	if dir == "" {
		t.Skip("helper process for TestJournalKilledMidApply")
	}
	var list []crashKnob
	if err := json.Unmarshal([]byte(os.Getenv(crashEnvKnobs)), &list); err != nil {
		t.Fatal(err)
	}
	at, _ := strconv.Atoi(os.Getenv(crashEnvAt))
	j, err := knobs.Open(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	knobs.SetTestAfterRecord(func(knobs.Knob) {
		if n == at {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		n++
	})
	for _, c := range list {
		k, err := knobs.Decode(c.Kind, c.Knob)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Set(k, []byte(c.Value)); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("helper was not killed")
}

func TestJournalKilledMidApply(t *testing.T) {
	_, chs := kernelChanges(t)
	state := filepath.Join(t.TempDir(), "state")
	var list []crashKnob
	for _, c := range chs {
		raw, _ := json.Marshal(c.knob)
		list = append(list, crashKnob{Kind: c.knob.Kind(), Knob: raw, Value: c.value})
	}
	enc, _ := json.Marshal(list)
	at := len(chs) - 2 // every knob before it written, it journaled but not written
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnvDir+"="+state, crashEnvKnobs+"="+string(enc), crashEnvAt+"="+strconv.Itoa(at))
	out, err := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
	}
	checkChanged(t, chs[:at])
	ents, err := knobs.ReadEntries(state)
	if err != nil || len(ents) != at+1 {
		t.Fatalf("journal after the kill has %d entries (%v), want %d", len(ents), err, at+1)
	}

	// A fresh journal, as a new lanes process would open it, recovers.
	j, err := knobs.Open(state, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, err := j.Restore(); err != nil {
		t.Fatal(err)
	}
	checkRestored(t, chs)
	if knobs.Exists(state) {
		t.Error("journal left behind")
	}
}

func TestJournalSkipsVanishedDevice(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[0]
	c := h.Containers[0]
	q := func(dev string) string { return "/sys/class/net/" + dev + "/queues/rx-0/rps_cpus" }
	vxKnob := knobs.Sysfs(h.NetNS, q(h.VXLAN))
	orig, err := vxKnob.Read()
	if err != nil {
		t.Fatal(err)
	}
	gone := []knobs.Knob{
		knobs.Sysfs(c.NetNS, q(c.Veth)),
		knobs.ProcSys(h.NetNS, "/proc/sys/net/ipv4/conf/"+c.HostVeth+"/rp_filter"),
		knobs.Feature(c.NetNS, c.Veth, ethtool.GRO),
	}
	j, err := knobs.Open(filepath.Join(t.TempDir(), "state"), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, k := range append([]knobs.Knob{vxKnob}, gone...) {
		v := "1"
		switch k.Kind() {
		case "procsys":
			v = "2"
		case "ethtool-feature":
			v = "on"
		}
		if err := j.Set(k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// Deleting one end of the veth pair removes both, synchronously.
	nh, err := netns.GetFromName(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	hd, err := netlink.NewHandleAt(nh)
	if err != nil {
		t.Fatal(err)
	}
	defer hd.Close()
	l, err := hd.LinkByName(c.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if err := hd.LinkDel(l); err != nil {
		t.Fatal(err)
	}

	rep, err := j.Restore()
	if err != nil {
		t.Fatalf("restore failed on vanished devices: %v", err)
	}
	if len(rep.Skipped) != len(gone) || len(rep.Restored) != 1 {
		t.Errorf("report %+v, want %d skipped and the vxlan restored", rep, len(gone))
	}
	if b, _ := vxKnob.Read(); !bytes.Equal(b, orig) {
		t.Errorf("vxlan rps_cpus = %q, want %q", b, orig)
	}
}

// TestQueueThreadKnob: a kthread knob named by (namespace, device, receive
// queue) finds the threaded NAPI poller of that queue, and a queue that
// does not exist reads as gone.
func TestQueueThreadKnob(t *testing.T) {
	f := topotest.New(t, topotest.Options{Containers: 1})
	c := f.Hosts[1].Containers[0]
	threaded := knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Veth+"/threaded")
	if err := threaded.Write([]byte("1")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { threaded.Write([]byte("0")) })
	topo, err := topology.Discover(f.Hosts[1].NetNS)
	if err != nil {
		t.Fatal(err)
	}
	ths := topo.Containers[0].Interfaces[0].NAPIThreads
	if len(ths) != 1 {
		t.Fatalf("NAPI threads of %s: %+v, want one", c.Veth, ths)
	}
	for _, ns := range []string{c.NetNS, "/run/netns/" + c.NetNS} {
		pid, err := knobs.QueueSched(ns, c.Veth, 0).PID()
		if err != nil || pid != ths[0].PID {
			t.Errorf("queue 0 of %s in %s: pid %d (%v), want %d (%s)", c.Veth, ns, pid, err, ths[0].PID, ths[0].Comm)
		}
	}
	if _, err := knobs.QueueSched(c.NetNS, c.Veth, 1).Read(); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("queue 1 (none): %v, want ErrGone", err)
	}
}

// TestJournalFromAnotherNetNS: a journal's "host" entries belong to the
// namespace the journaling lanes ran in. Opened by a lanes running in
// another one (under `ip netns exec`), it is refused, so a reset there
// never writes that namespace's sysctls with the host's originals; from
// the namespace that wrote it, it opens and restores as before.
func TestJournalFromAnotherNetNS(t *testing.T) {
	testenv.Root(t)
	other := topotest.Namespace(t, topotest.NewPrefix()+"-jns")
	dir, ks := memKnobs(t, 1)
	j, err := knobs.Open(filepath.Join(dir, "target"), "host")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Set(ks[0], []byte("new")); err != nil {
		t.Fatal(err)
	}
	j.Close()
	err = nsx.Do(other, func() error {
		j, err := knobs.Open(filepath.Join(dir, "target"), "host")
		if err == nil {
			j.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "another network namespace") {
		t.Fatalf("opening the journal from netns %s: %v, want a refusal naming the other namespace", other, err)
	}
	// lanes agent checks without opening it.
	if err := nsx.Do(other, func() error { return knobs.CheckHostNetNS(filepath.Join(dir, "target")) }); err == nil {
		t.Errorf("CheckHostNetNS from netns %s: no refusal", other)
	}
	if err := knobs.CheckHostNetNS(filepath.Join(dir, "target")); err != nil {
		t.Errorf("CheckHostNetNS from the namespace that wrote it: %v", err)
	}
	j, err = knobs.Open(filepath.Join(dir, "target"), "host")
	if err != nil {
		t.Fatalf("opening the journal from the namespace that wrote it: %v", err)
	}
	defer j.Close()
	if rep, err := j.Restore(); err != nil || len(rep.Restored) != 1 {
		t.Fatalf("restore: %+v, %v", rep, err)
	}
	if b, _ := ks[0].Read(); string(b) != "orig0\x00\n " {
		t.Errorf("knob after restore = %q", b)
	}
}

// TestJournalWithoutHostNetNS: a journal written before the cookie was
// kept opens from any namespace, as before, and is not stamped with the
// cookie of the namespace that happened to open it.
func TestJournalWithoutHostNetNS(t *testing.T) {
	testenv.Root(t)
	other := topotest.Namespace(t, topotest.NewPrefix()+"-jold")
	dir, ks := memKnobs(t, 2)
	tdir := filepath.Join(dir, "target")
	j, err := knobs.Open(tdir, "host")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Set(ks[0], []byte("new")); err != nil {
		t.Fatal(err)
	}
	j.Close()
	path := filepath.Join(tdir, knobs.JournalFile)
	var doc map[string]any
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc["host_netns"]; !ok {
		t.Fatalf("journal has no host_netns: %s", b)
	}
	delete(doc, "host_netns")
	if b, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	err = nsx.Do(other, func() error {
		j, err := knobs.Open(tdir, "host")
		if err != nil {
			return err
		}
		defer j.Close()
		return j.Set(ks[1], []byte("new")) // saves the journal
	})
	if err != nil {
		t.Fatalf("an old journal from netns %s: %v", other, err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), "host_netns") {
		t.Errorf("an old journal was stamped with the opener's namespace: %s", b)
	}
}

// A user's apply failed writing a read-only knob, its rollback failed on
// the same knob, and every reset after failed on it, though lanes never
// changed it. Here the knob is a /proc/sys file bind-mounted read-only
// in a private mount namespace of the test's thread: the failed write
// leaves nothing journaled, and a knob recorded but never written (a
// crash between the two) restores without a write.
func TestResetConvergesReadOnlyKnob(t *testing.T) {
	testenv.Root(t)
	const path = "/proc/sys/net/core/somaxconn"
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its mount namespace
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
				return err
			}
			if err := unix.Mount(path, path, "", unix.MS_BIND, ""); err != nil {
				return err
			}
			if err := unix.Mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return err
			}
			k := knobs.ProcSys("", path)
			orig, err := k.Read()
			if err != nil {
				return err
			}
			state := filepath.Join(t.TempDir(), "state")
			j, err := knobs.Open(state, "host")
			if err != nil {
				return err
			}
			defer j.Close()
			if err := j.Set(k, []byte("4095")); !errors.Is(err, unix.EROFS) {
				return fmt.Errorf("writing the read-only knob: %v, want EROFS", err)
			}
			if j.Len() != 0 {
				return fmt.Errorf("the journal keeps %d entries for a write that never happened", j.Len())
			}
			if err := j.Record(k); err != nil {
				return err
			}
			rep, err := j.Restore()
			if err != nil {
				return fmt.Errorf("reset of a recorded, never written read-only knob: %v (%+v)", err, rep)
			}
			if b, _ := k.Read(); !bytes.Equal(b, orig) || knobs.Exists(state) {
				return fmt.Errorf("after reset: %q (was %q), journal left %v", b, orig, knobs.Exists(state))
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
