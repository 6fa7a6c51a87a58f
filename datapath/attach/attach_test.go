package attach_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestKindsRegistered(t *testing.T) {
	for _, k := range []string{attach.KindXDP, attach.KindTCX, attach.KindBPFFS, attach.KindPinDir} {
		if !slices.Contains(knobs.Kinds(), k) {
			t.Errorf("kind %s not registered", k)
		}
	}
}

func TestXDP(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	xdpPin, _ := pinProgs(t, fs)
	k := &attach.XDP{NetNS: ns, Device: "veth0", Prog: xdpPin, Link: filepath.Join(fs, "xdp_link")}
	if want := "xdp-link:" + ns + ":veth0"; k.Key() != want {
		t.Errorf("key %q, want %q", k.Key(), want)
	}

	wantRead(t, k, "")
	write(t, k, attach.ValueAttached)
	wantRead(t, k, attach.ValueAttached)
	exists(t, k.Link)
	prog, err := ebpf.LoadPinnedProgram(xdpPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if got, want := xdpID(t, ns, "veth0"), progID(t, prog); got != uint32(want) {
		t.Fatalf("veth0 runs XDP program %d, want the pinned one, %d", got, want)
	}
	if id := xdpID(t, ns, "veth1"); id != 0 {
		t.Fatalf("veth1 runs XDP program %d, want none", id)
	}
	jsonRoundTrip(t, k, &attach.XDP{})

	// Attached again: nothing changes.
	write(t, k, attach.ValueAttached)
	wantRead(t, k, attach.ValueAttached)

	// A reloaded program at the same pin replaces the old one in place.
	if err := os.Remove(xdpPin); err != nil {
		t.Fatal(err)
	}
	newID := pinProg(t, ebpf.XDP, "lanes_t_xdp2", xdpPin)
	write(t, k, attach.ValueAttached)
	wantRead(t, k, attach.ValueAttached)
	if got := xdpID(t, ns, "veth0"); got != uint32(newID) {
		t.Fatalf("after reload veth0 runs XDP program %d, want %d", got, newID)
	}

	write(t, k, "")
	wantRead(t, k, "")
	gone(t, k.Link)
	if id := xdpID(t, ns, "veth0"); id != 0 {
		t.Fatalf("after detach veth0 runs XDP program %d", id)
	}
	write(t, k, "") // detaching what is not attached is fine

	if err := k.Write([]byte("yes")); err == nil {
		t.Error("Write(yes) succeeded")
	}
}

func TestXDPGenericMode(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	xdpPin, _ := pinProgs(t, fs)
	k := &attach.XDP{NetNS: ns, Device: "veth1", Prog: xdpPin, Link: filepath.Join(fs, "l"), Mode: "generic"}
	write(t, k, attach.ValueAttached)
	wantRead(t, k, attach.ValueAttached)
	var mode uint32
	netnsx.Do(ns, func() error {
		l, err := netlink.LinkByName("veth1")
		if err == nil {
			mode = l.Attrs().Xdp.AttachMode
		}
		return err
	})
	if mode != 2 { // XDP_ATTACHED_SKB
		t.Errorf("attach mode %d, want generic (2)", mode)
	}
	jsonRoundTrip(t, k, &attach.XDP{})
	write(t, k, "")
	wantRead(t, k, "")

	bad := &attach.XDP{NetNS: ns, Device: "veth1", Prog: xdpPin, Link: filepath.Join(fs, "l"), Mode: "turbo"}
	if err := bad.Write([]byte(attach.ValueAttached)); err == nil || !strings.Contains(err.Error(), "unknown XDP mode") {
		t.Errorf("mode turbo: %v", err)
	}
}

func TestXDPRefusesForeignProgram(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	xdpPin, _ := pinProgs(t, fs)
	foreign := newProg(t, ebpf.XDP, "foreign_xdp")
	foreignID := progID(t, foreign)
	err := netnsx.Do(ns, func() error {
		l, err := netlink.LinkByName("veth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFd(l, foreign.FD())
	})
	foreign.Close() // the device holds it now
	if err != nil {
		t.Fatal(err)
	}

	k := &attach.XDP{NetNS: ns, Device: "veth0", Prog: xdpPin, Link: filepath.Join(fs, "xdp_link")}
	wantRead(t, k, "")
	err = k.Write([]byte(attach.ValueAttached))
	var fe *attach.ForeignXDPError
	if !errors.As(err, &fe) {
		t.Fatalf("attach over a foreign program: %v, want ForeignXDPError", err)
	}
	want := "device veth0 in netns " + ns + " already has XDP program id " +
		strconv.FormatUint(uint64(foreignID), 10) + " (name foreign_xdp) attached: lanes will not replace it"
	if err.Error() != want {
		t.Errorf("error\n %q, want\n %q", err, want)
	}

	// Through the journal: the set fails, and restoring leaves the
	// foreign program where it was.
	j, err := knobs.Open(t.TempDir(), "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Set(k, []byte(attach.ValueAttached)); !errors.As(err, &fe) {
		t.Fatalf("journaled attach: %v", err)
	}
	if _, err := j.Restore(); err != nil {
		t.Fatal(err)
	}
	if got := xdpID(t, ns, "veth0"); got != uint32(foreignID) {
		t.Fatalf("veth0 runs %d, want the foreign program %d still", got, foreignID)
	}
	gone(t, k.Link)
	wantRead(t, k, "")
}

func TestXDPStalePin(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	xdpPin, _ := pinProgs(t, fs)
	k := &attach.XDP{NetNS: ns, Device: "veth0", Prog: xdpPin, Link: filepath.Join(fs, "xdp_link")}
	write(t, k, attach.ValueAttached)

	// The device is recreated: the pinned link now points to nothing.
	delVeth(t, ns)
	if _, err := k.Read(); !errors.Is(err, knobs.ErrGone) {
		t.Fatalf("Read without the device: %v, want ErrGone", err)
	}
	addVeth(t, ns)
	wantRead(t, k, "")
	exists(t, k.Link)
	write(t, k, attach.ValueAttached)
	wantRead(t, k, attach.ValueAttached)
	write(t, k, "")

	// A pin that is not a link is not lanes' attachment: it reads as
	// nothing attached, is not replaced, and detaching leaves it alone.
	k.Link = xdpPin
	wantRead(t, k, "")
	if err := k.Write([]byte(attach.ValueAttached)); err == nil || !strings.Contains(err.Error(), "is not a BPF link pin") {
		t.Fatalf("attach with a program pin at Link: %v", err)
	}
	write(t, k, "")
	exists(t, xdpPin)
	if id := xdpID(t, ns, "veth0"); id != 0 {
		t.Fatalf("veth0 runs XDP program %d", id)
	}

	// Nor is a tcx link at an XDP knob's pin path.
	tcPin := filepath.Join(fs, "tc_prog")
	tc := &attach.TCX{NetNS: ns, Device: "veth0", Direction: "ingress", Prog: tcPin, Link: filepath.Join(fs, "tcx_link")}
	write(t, tc, attach.ValueAttached)
	k.Link = tc.Link
	wantRead(t, k, "")
	if err := k.Write([]byte(attach.ValueAttached)); err == nil || !strings.Contains(err.Error(), "not xdp") {
		t.Fatalf("attach over a tcx link pin: %v", err)
	}
	write(t, k, "")
	wantRead(t, tc, attach.ValueAttached)
	write(t, tc, "")
}

func TestTCX(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	_, tcPin := pinProgs(t, fs)
	in := &attach.TCX{NetNS: ns, Device: "veth0", Direction: "ingress", Prog: tcPin, Link: filepath.Join(fs, "tcx_in")}
	out := &attach.TCX{NetNS: ns, Device: "veth0", Direction: "egress", Prog: tcPin, Link: filepath.Join(fs, "tcx_out")}
	if want := "tcx-link:" + ns + ":veth0:ingress#tcx_in"; in.Key() != want {
		t.Errorf("key %q, want %q", in.Key(), want)
	}

	// Someone else's tcx program is already there; lanes goes after it.
	other := newProg(t, ebpf.SchedCLS, "other_tc")
	defer other.Close()
	otherID := progID(t, other)
	var otherLink link.Link
	err := netnsx.Do(ns, func() error {
		l, err := netlink.LinkByName("veth0")
		if err != nil {
			return err
		}
		otherLink, err = link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: other, Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer otherLink.Close()

	prog, err := ebpf.LoadPinnedProgram(tcPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	ours := progID(t, prog)

	for _, k := range []*attach.TCX{in, out} {
		wantRead(t, k, "")
		write(t, k, attach.ValueAttached)
		wantRead(t, k, attach.ValueAttached)
		write(t, k, attach.ValueAttached)
		jsonRoundTrip(t, k, &attach.TCX{})
	}
	if got := tcxProgs(t, ns, "veth0", ebpf.AttachTCXIngress); !slices.Equal(got, []ebpf.ProgramID{otherID, ours}) {
		t.Fatalf("ingress runs %v, want [%d %d]", got, otherID, ours)
	}
	if got := tcxProgs(t, ns, "veth0", ebpf.AttachTCXEgress); !slices.Equal(got, []ebpf.ProgramID{ours}) {
		t.Fatalf("egress runs %v, want [%d]", got, ours)
	}
	// The ingress link is no egress link.
	wrong := *out
	wrong.Link = in.Link
	wantRead(t, &wrong, "")

	for _, k := range []*attach.TCX{in, out} {
		write(t, k, "")
		wantRead(t, k, "")
		gone(t, k.Link)
	}
	if got := tcxProgs(t, ns, "veth0", ebpf.AttachTCXIngress); !slices.Equal(got, []ebpf.ProgramID{otherID}) {
		t.Fatalf("after detach ingress runs %v, want only the other program %d", got, otherID)
	}
	if got := tcxProgs(t, ns, "veth0", ebpf.AttachTCXEgress); len(got) != 0 {
		t.Fatalf("after detach egress runs %v", got)
	}

	bad := &attach.TCX{NetNS: ns, Device: "veth0", Direction: "sideways", Prog: tcPin, Link: filepath.Join(fs, "x")}
	if err := bad.Write([]byte(attach.ValueAttached)); err == nil || !strings.Contains(err.Error(), "bad direction") {
		t.Errorf("direction sideways: %v", err)
	}
	// An XDP program is no tc classifier.
	xdpAsTC := &attach.TCX{NetNS: ns, Device: "veth0", Direction: "ingress", Prog: filepath.Join(fs, "xdp_prog"), Link: filepath.Join(fs, "x")}
	if err := xdpAsTC.Write([]byte(attach.ValueAttached)); err == nil || !strings.Contains(err.Error(), "not SchedCLS") {
		t.Errorf("XDP program on tcx: %v", err)
	}
	gone(t, filepath.Join(fs, "x"))
}

// TestJournal runs lanes' whole sequence through a journal (mount bpffs,
// make the pin dir, pin, attach) and a reset from a fresh journal handle,
// with one link pinned but never journaled, as a crash would leave it.
func TestJournal(t *testing.T) {
	testenv.Root(t)
	ns := testNetns(t)
	mnt := filepath.Join(t.TempDir(), "bpf")
	trackMount(t, mnt)
	state := t.TempDir()
	pins := filepath.Join(mnt, "lanes", "host")

	j, err := knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	fsKnob := &attach.BPFFS{Path: mnt}
	pinDir := &attach.PinDir{Path: pins}
	for _, s := range []struct {
		k knobs.Knob
		v string
	}{{fsKnob, attach.ValueMounted}, {pinDir, attach.ValuePresent}} {
		if err := j.Set(s.k, []byte(s.v)); err != nil {
			t.Fatal(err)
		}
	}
	xdpPin, tcPin := pinProgs(t, pins)
	ks := []knobs.Knob{
		&attach.XDP{NetNS: ns, Device: "veth0", Prog: xdpPin, Link: filepath.Join(pins, "link_xdp_veth0")},
		&attach.TCX{NetNS: ns, Device: "veth0", Direction: "ingress", Prog: tcPin, Link: filepath.Join(pins, "link_tcx_veth0_in")},
		&attach.TCX{NetNS: ns, Device: "veth1", Direction: "egress", Prog: tcPin, Link: filepath.Join(pins, "link_tcx_veth1_out")},
	}
	for _, k := range ks {
		if err := j.Set(k, []byte(attach.ValueAttached)); err != nil {
			t.Fatal(err)
		}
		wantRead(t, k, attach.ValueAttached)
	}
	orphan := &attach.TCX{NetNS: ns, Device: "veth1", Direction: "ingress", Prog: tcPin, Link: filepath.Join(pins, "sub", "orphan")}
	if err := os.Mkdir(filepath.Join(pins, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, orphan, attach.ValueAttached)
	if len(tcxProgs(t, ns, "veth1", ebpf.AttachTCXIngress)) != 1 {
		t.Fatal("orphan link not attached")
	}
	j.Close()

	// A fresh handle decodes every knob from the journal alone.
	j, err = knobs.Open(state, "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.Len() != 5 {
		t.Fatalf("journal has %d entries, want 5", j.Len())
	}
	rep, err := j.Restore()
	if err != nil {
		t.Fatalf("restore: %v (%+v)", err, rep)
	}
	if len(rep.Restored) != 5 {
		t.Fatalf("restored %v", rep)
	}
	if id := xdpID(t, ns, "veth0"); id != 0 {
		t.Errorf("veth0 still runs XDP program %d", id)
	}
	for _, dev := range []string{"veth0", "veth1"} {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			if got := tcxProgs(t, ns, dev, at); len(got) != 0 {
				t.Errorf("%s %s still runs tcx programs %v", dev, at, got)
			}
		}
	}
	gone(t, pins)
	if countMounts(mnt) != 0 {
		t.Errorf("%s still mounted", mnt)
	}
	wantRead(t, fsKnob, "")
	if knobs.Exists(state) {
		t.Error("journal not removed after a full restore")
	}
}

func TestGone(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	xdpPin, tcPin := pinProgs(t, fs)
	x := &attach.XDP{NetNS: ns, Device: "veth0", Prog: xdpPin, Link: filepath.Join(fs, "xdp_link")}
	tc := &attach.TCX{NetNS: ns, Device: "veth1", Direction: "egress", Prog: tcPin, Link: filepath.Join(fs, "tcx_link")}
	j, err := knobs.Open(t.TempDir(), "host")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, k := range []knobs.Knob{x, tc} {
		if err := j.Set(k, []byte(attach.ValueAttached)); err != nil {
			t.Fatal(err)
		}
	}
	noDev := &attach.XDP{NetNS: ns, Device: "nosuch0", Prog: xdpPin, Link: filepath.Join(fs, "l")}
	if _, err := noDev.Read(); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("Read on a missing device: %v, want ErrGone", err)
	}

	if err := nsx.Delete(ns); err != nil {
		t.Fatal(err)
	}
	for _, k := range []knobs.Knob{x, tc} {
		if _, err := k.Read(); !errors.Is(err, knobs.ErrGone) {
			t.Errorf("%s Read: %v, want ErrGone", k.Key(), err)
		}
		if err := k.Write([]byte(attach.ValueAttached)); !errors.Is(err, knobs.ErrGone) {
			t.Errorf("%s Write(attached): %v, want ErrGone", k.Key(), err)
		}
	}
	if _, err := attach.Attached(ns, "veth0"); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("Attached: %v, want ErrGone", err)
	}
	if err := x.Write(nil); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("XDP Write(\"\"): %v, want ErrGone", err)
	}
	// The pin is in bpffs, not the namespace: gone or not, it goes.
	gone(t, x.Link)

	rep, err := j.Restore()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Skipped) != 2 || len(rep.Restored) != 0 {
		t.Fatalf("restore report %+v, want both skipped", rep)
	}
	gone(t, tc.Link)
}

// TestPinsAcrossNetns checks what the package relies on: entering a network
// namespace leaves the mount namespace, and so the pins, as they were.
func TestPinsAcrossNetns(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	ns := testNetns(t)
	xdpPin, _ := pinProgs(t, fs)
	var outside, inside unix.Stat_t
	if err := unix.Stat(xdpPin, &outside); err != nil {
		t.Fatal(err)
	}
	var insideID ebpf.ProgramID
	err := netnsx.Do(ns, func() error {
		if err := unix.Stat(xdpPin, &inside); err != nil {
			return err
		}
		p, err := ebpf.LoadPinnedProgram(xdpPin, nil)
		if err != nil {
			return err
		}
		defer p.Close()
		insideID = progID(t, p)
		return nil
	})
	if err != nil {
		t.Fatalf("pin not visible inside netns: %v", err)
	}
	if inside.Dev != outside.Dev || inside.Ino != outside.Ino {
		t.Fatalf("pin is %d:%d inside the netns, %d:%d outside", inside.Dev, inside.Ino, outside.Dev, outside.Ino)
	}
	p, err := ebpf.LoadPinnedProgram(xdpPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if id := progID(t, p); id != insideID {
		t.Fatalf("pin holds program %d inside the netns, %d outside", insideID, id)
	}
}
