// Package attach attaches pinned BPF programs to network devices, and
// mounts bpffs, as journaled knobs (see package knobs).
//
// Programs are loaded and pinned elsewhere. This package attaches them with
// bpf_links and pins each link in bpffs: a pinned link outlives the lanes
// process that made it, so the datapath keeps running without lanes, and a
// later process (a reset after a crash) can find the link by its pin and
// remove it. Attaching through links, never through netlink, is also what
// lets lanes tell its own attachment from someone else's.
//
// The knobs are meant to be journaled in this order, so that Restore
// (newest first) unwinds them in reverse:
//
//  1. BPFFS: mount bpffs if the host has none.
//  2. PinDir: the directory lanes pins into. Recorded before any pin exists
//     and therefore restored after every link, it removes whatever lanes
//     pinned, even pins that a crash kept from being journaled.
//  3. The loader pins programs and maps into the PinDir.
//  4. XDP and TCX: one per device (and direction).
//
// Pins live in the mount namespace, network devices in the network
// namespace. nsx.Do switches only the latter, so a pin path means the same
// file inside and outside a device's namespace.
package attach

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/vishvananda/netlink"
)

// Knob kinds, as they appear in the journal.
const (
	KindXDP    = "xdp-link"
	KindTCX    = "tcx-link"
	KindBPFFS  = "bpffs-mount"
	KindPinDir = "bpf-pins"
)

// Knob values other than "", which means "not done by lanes" for every kind.
const (
	ValueAttached = "attached" // XDP, TCX: the program is attached through the pinned link
	ValueMounted  = "mounted"  // BPFFS: a bpf filesystem is mounted at Path
	ValuePresent  = "present"  // PinDir: the directory exists
)

func init() {
	knobs.Register(KindXDP, func() knobs.Knob { return &XDP{} })
	knobs.Register(KindTCX, func() knobs.Knob { return &TCX{} })
	knobs.Register(KindBPFFS, func() knobs.Knob { return &BPFFS{} })
	knobs.Register(KindPinDir, func() knobs.Knob { return &PinDir{} })
}

// nsLabel names a namespace the way package knobs does in keys.
func nsLabel(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}

// ifindexOf resolves dev in the calling thread's network namespace.
func ifindexOf(dev string) (int, netlink.Link, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, nil, fmt.Errorf("device %s: %w", dev, knobs.ErrGone)
		}
		return 0, nil, fmt.Errorf("looking up device %s: %w", dev, err)
	}
	return l.Attrs().Index, l, nil
}

// Attached returns the id of the XDP program attached to dev in namespace
// netns, 0 if there is none, however it was attached (link or netlink). A
// missing device or namespace wraps knobs.ErrGone.
func Attached(netns, dev string) (uint32, error) {
	var id uint32
	err := netnsx.Do(netns, func() error {
		var err error
		id, err = xdpProgID(dev)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("XDP program of %s in netns %s: %w", dev, nsLabel(netns), err)
	}
	return id, nil
}

// xdpProgID is Attached inside the namespace.
func xdpProgID(dev string) (uint32, error) {
	_, l, err := ifindexOf(dev)
	if err != nil {
		return 0, err
	}
	return xdpProgOf(l)
}

// xdpAttachedMulti is XDP_ATTACHED_MULTI (linux/if_link.h), which neither
// x/sys nor netlink define.
const xdpAttachedMulti = 4

func xdpProgOf(l netlink.Link) (uint32, error) {
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return 0, nil
	}
	// With programs in two modes (one offloaded to hardware) the kernel
	// reports no single id, and netlink does not parse the per-mode ones.
	// Saying 0 would let lanes believe the device free.
	if x.AttachMode == xdpAttachedMulti || x.ProgId == 0 {
		return 0, fmt.Errorf("device %s has XDP programs in several modes (hardware offload): lanes does not handle that", l.Attrs().Name)
	}
	return x.ProgId, nil
}

// loadProg opens the program pinned at path and checks its type, so a
// wrong pin fails with its path in the error rather than deep in attach.
func loadProg(path string, want ebpf.ProgramType) (*ebpf.Program, error) {
	p, err := ebpf.LoadPinnedProgram(path, nil)
	if err != nil {
		return nil, fmt.Errorf("loading program pinned at %s: %w", path, err)
	}
	if p.Type() != want {
		p.Close()
		return nil, fmt.Errorf("program pinned at %s is %s, not %s", path, p.Type(), want)
	}
	return p, nil
}

// progName is the name of a program by id, for messages only.
func progName(id uint32) string {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return "unknown"
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Name == "" {
		return "unknown"
	}
	return info.Name
}

// pinnedLink is what a link pin holds: l is nil when there is no pin, or
// when the pin is not a link of the knob's type (then other says what it
// is). Either way no link of this knob is attached through it.
type pinnedLink struct {
	path  string
	l     link.Link
	info  *link.Info
	other error
}

// loadLink opens the link pinned at path. Only failing to look is an
// error; what the pin turns out to be is in the result.
func loadLink(path string, want link.Type) (*pinnedLink, error) {
	p := &pinnedLink{path: path}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return p, nil
	} else if err != nil {
		return nil, err
	}
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		p.other = fmt.Errorf("%s exists but is not a BPF link pin (%w): lanes will not replace it", path, err)
		return p, nil
	}
	info, err := l.Info()
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("link pinned at %s: %w", path, err)
	}
	if info.Type != want {
		l.Close()
		p.other = fmt.Errorf("%s is a link of type %d, not %s: lanes will not replace it", path, info.Type, linkTypeName(want))
		return p, nil
	}
	p.l, p.info = l, info
	return p, nil
}

func (p *pinnedLink) close() {
	if p != nil && p.l != nil {
		p.l.Close()
	}
}

// remove detaches the link and deletes its pin. Detaching explicitly,
// rather than relying on the last reference going away, also covers a link
// that another process (bpftool, a lanes still shutting down) holds open.
// Detaching a link whose device is gone is a no-op in the kernel.
func (p *pinnedLink) remove() error {
	if p.l == nil {
		return nil
	}
	l := p.l
	p.l, p.info = nil, nil
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
		return fmt.Errorf("detaching link pinned at %s: %w", p.path, err)
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpinning link %s: %w", p.path, err)
	}
	return nil
}

// detachPinned is Write("") of the link knobs. The pin lives in bpffs, not
// in the namespace, so it is removed even when the namespace or device is
// gone: no link, live or defunct, outlives a reset. Gone is still reported,
// so Restore counts the knob as skipped rather than restored. Something
// other than a link of the knob's type at the pin path is not lanes'
// attachment; it is left alone and the knob already reads "".
func detachPinned(netns, dev, pin string, want link.Type) error {
	gone := netnsx.Do(netns, func() error {
		_, _, err := ifindexOf(dev)
		return err
	})
	if gone != nil && !errors.Is(gone, knobs.ErrGone) {
		return gone
	}
	p, err := loadLink(pin, want)
	if err != nil {
		return err
	}
	defer p.close()
	if err := p.remove(); err != nil {
		return err
	}
	return gone
}

// update points a link that is already ours at prog, unless it runs prog
// already: a reload of the programs then swaps them atomically instead of
// leaving the device without a program between detach and attach.
func (p *pinnedLink) update(prog *ebpf.Program) error {
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info: %w", err)
	}
	if id, ok := info.ID(); ok && id == p.info.Program {
		return nil
	}
	if err := p.l.Update(prog); err != nil {
		return fmt.Errorf("replacing the program of the link pinned at %s: %w", p.path, err)
	}
	return nil
}

// clearStale removes a pin whose link lost its device (ifindex 0: the device
// or its namespace was deleted, or someone detached the link), so a new link
// can be pinned in its place. A live link that is not ours is left alone.
func (p *pinnedLink) clearStale(ifindex uint32) error {
	if p.other != nil {
		return p.other
	}
	if p.l == nil {
		return nil
	}
	if ifindex != 0 {
		return fmt.Errorf("%s holds a link attached elsewhere (ifindex %d, program id %d): lanes will not replace it", p.path, ifindex, p.info.Program)
	}
	return p.remove()
}

func linkTypeName(t link.Type) string {
	switch t {
	case link.XDPType:
		return "xdp"
	case link.TCXType:
		return "tcx"
	}
	return fmt.Sprintf("type %d", t)
}

// readLink is Read of the link knobs: ValueAttached when the device's
// state (read by in) shows lanes' link, "" otherwise.
func readLink[S any](k fmt.Stringer, in func(func(S) error) error, ours func(S) bool) ([]byte, error) {
	var v []byte
	err := in(func(s S) error {
		if ours(s) {
			v = []byte(ValueAttached)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", k, err)
	}
	return v, nil
}

// writeLink is Write of the link knobs: "" detaches the link pinned at pin
// (of type lt), ValueAttached runs attach.
func writeLink(k fmt.Stringer, v []byte, ns, dev, pin string, lt link.Type, attach func() error) error {
	switch string(v) {
	case "":
		if err := detachPinned(ns, dev, pin, lt); err != nil {
			return fmt.Errorf("detaching %s: %w", k, err)
		}
		return nil
	case ValueAttached:
		return attach()
	}
	return fmt.Errorf("%s: bad value %q (want %q or \"\")", k, v, ValueAttached)
}
