//go:build linux

package reorder

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/netnsx"
)

// Root is a device's root qdisc as netlink shows it.
type Root struct {
	Kind   string
	Handle uint32
	// Qlen is the frames the qdisc has queued (for the reassembler:
	// its FIFO and what it holds), from the qdisc's statistics.
	Qlen uint32
}

// Default reports whether the root is the one the kernel gives a device
// when nobody configured one (noqueue on a veth, pfifo_fast or mq
// elsewhere): those have handle 0, while every qdisc someone added has a
// handle of its own.
func (r Root) Default() bool { return r.Handle == 0 }

func (r Root) String() string {
	return fmt.Sprintf("%s %x:", r.Kind, r.Handle>>16)
}

// linkOf resolves dev in the calling thread's namespace.
func linkOf(dev string) (netlink.Link, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("device %s: %w", dev, knobs.ErrGone)
		}
		return nil, fmt.Errorf("looking up device %s: %w", dev, err)
	}
	return l, nil
}

// rootOf is the root qdisc of l.
func rootOf(l netlink.Link) (Root, error) {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return Root{}, fmt.Errorf("listing the qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		a := q.Attrs()
		if a.LinkIndex == l.Attrs().Index && a.Parent == netlink.HANDLE_ROOT {
			r := Root{Kind: q.Type(), Handle: a.Handle}
			if s := a.Statistics; s != nil && s.Queue != nil {
				r.Qlen = s.Queue.Qlen
			}
			return r, nil
		}
	}
	// A device that is down has no qdisc yet (noop): the default.
	return Root{}, nil
}

// RootQdisc is the root qdisc of dev in netns.
func RootQdisc(netns, dev string) (Root, error) {
	var r Root
	err := netnsx.Do(netns, func() error {
		l, err := linkOf(dev)
		if err != nil {
			return err
		}
		r, err = rootOf(l)
		return err
	})
	return r, err
}

// AttachRoot makes a qdisc of kind the root of dev in netns. The device's
// root must be its default: lanes never replaces a qdisc someone set up
// (it could not put it back as it was).
func AttachRoot(netns, dev, kind string) error {
	return netnsx.Do(netns, func() error {
		l, err := linkOf(dev)
		if err != nil {
			return err
		}
		r, err := rootOf(l)
		if err != nil {
			return err
		}
		if r.Kind == kind {
			return nil
		}
		if !r.Default() {
			return fmt.Errorf("%s in netns %s has root qdisc %s: lanes does not replace a qdisc it did not set (remove it, or leave this device without reassembly)", dev, label(netns), r)
		}
		q := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT},
			QdiscType:  kind,
		}
		if err := netlink.QdiscAdd(q); err != nil {
			return fmt.Errorf("attaching qdisc %s to %s in netns %s: %w", kind, dev, label(netns), err)
		}
		return nil
	})
}

// DetachRoot deletes dev's root qdisc if it is of kind, which gives the
// device its default root back. Another root is left alone.
func DetachRoot(netns, dev, kind string) error {
	return netnsx.Do(netns, func() error {
		l, err := linkOf(dev)
		if err != nil {
			return err
		}
		r, err := rootOf(l)
		if err != nil || r.Kind != kind {
			return err
		}
		q := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: r.Handle},
			QdiscType:  kind,
		}
		if err := netlink.QdiscDel(q); err != nil {
			return fmt.Errorf("deleting qdisc %s of %s in netns %s: %w", kind, dev, label(netns), err)
		}
		return nil
	})
}

func label(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}
