package attach

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/internal/netnsx"
)

// XDP attaches the program pinned at Prog to Device's XDP hook in NetNS
// through a bpf_link pinned at Link. Its value is ValueAttached when that
// link is what runs on the device, "" otherwise, including when a program
// that is not lanes' runs there.
type XDP struct {
	NetNS  string `json:"netns,omitempty"`
	Device string `json:"device"`
	Prog   string `json:"prog"`
	Link   string `json:"link"`
	// Mode is "native" (the default: in the driver) or "generic" (after
	// the skb is built, for devices without native XDP).
	Mode string `json:"mode,omitempty"`
}

func (k *XDP) Kind() string { return KindXDP }
func (k *XDP) Key() string  { return KindXDP + ":" + nsLabel(k.NetNS) + ":" + k.Device }
func (k *XDP) String() string {
	return fmt.Sprintf("XDP on %s in netns %s", k.Device, nsLabel(k.NetNS))
}

func (k *XDP) flags() (link.XDPAttachFlags, error) {
	switch k.Mode {
	case "", "native":
		return link.XDPDriverMode, nil
	case "generic":
		return link.XDPGenericMode, nil
	}
	return 0, fmt.Errorf("%s: unknown XDP mode %q (use native or generic)", k, k.Mode)
}

// ForeignXDPError is Write(ValueAttached) refusing a device that runs an
// XDP program lanes did not attach: replacing it would silently break
// whoever did.
type ForeignXDPError struct {
	NetNS  string
	Device string
	ProgID uint32
	Name   string
}

func (e *ForeignXDPError) Error() string {
	return fmt.Sprintf("device %s in netns %s already has XDP program id %d (name %s) attached: lanes will not replace it",
		e.Device, nsLabel(e.NetNS), e.ProgID, e.Name)
}

// xdpState is the device and the link pin, seen from inside the namespace.
type xdpState struct {
	ifindex int
	devProg uint32 // what the device runs, whoever attached it; 0 for nothing
	pin     *pinnedLink
}

func (s *xdpState) linkIfindex() uint32 {
	if s.pin.l == nil || s.pin.info.XDP() == nil {
		return 0
	}
	return s.pin.info.XDP().Ifindex
}

// ours: the pinned link is live on this device and its program is the one
// the device runs. An ifindex alone could belong to a namesake device in
// another namespace; the program id settles it.
func (s *xdpState) ours() bool {
	return s.pin.l != nil && s.linkIfindex() == uint32(s.ifindex) &&
		s.devProg != 0 && uint32(s.pin.info.Program) == s.devProg
}

// in runs fn inside the namespace with the current state.
func (k *XDP) in(fn func(*xdpState) error) error {
	return netnsx.Do(k.NetNS, func() error {
		idx, l, err := ifindexOf(k.Device)
		if err != nil {
			return err
		}
		s := &xdpState{ifindex: idx}
		if s.devProg, err = xdpProgOf(l); err != nil {
			return err
		}
		if s.pin, err = loadLink(k.Link, link.XDPType); err != nil {
			return err
		}
		defer s.pin.close()
		return fn(s)
	})
}

func (k *XDP) Read() ([]byte, error) {
	return readLink(k, k.in, (*xdpState).ours)
}

// Write: attach wraps its own errors, leaving a ForeignXDPError as it is.
func (k *XDP) Write(v []byte) error {
	return writeLink(k, v, k.NetNS, k.Device, k.Link, link.XDPType, k.attach)
}

func (k *XDP) attach() error {
	flags, err := k.flags()
	if err != nil {
		return err
	}
	err = k.in(func(s *xdpState) error {
		if !s.ours() && s.devProg != 0 {
			return &ForeignXDPError{NetNS: k.NetNS, Device: k.Device, ProgID: s.devProg, Name: progName(s.devProg)}
		}
		prog, err := loadProg(k.Prog, ebpf.XDP)
		if err != nil {
			return err
		}
		defer prog.Close()
		if s.ours() {
			return s.pin.update(prog)
		}
		if err := s.pin.clearStale(s.linkIfindex()); err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: s.ifindex, Flags: flags})
		if err != nil {
			return err
		}
		// Closing our fd leaves the attachment to the pin; without a pin
		// it detaches, which is the right outcome of a failed Pin too.
		defer l.Close()
		if err := l.Pin(k.Link); err != nil {
			return fmt.Errorf("pinning link at %s (left unattached): %w", k.Link, err)
		}
		return nil
	})
	var foreign *ForeignXDPError
	if err != nil && !errors.As(err, &foreign) {
		return fmt.Errorf("attaching %s: %w", k, err)
	}
	return err
}
