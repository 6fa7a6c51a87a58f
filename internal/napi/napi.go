// Package napi lists a device's NAPI instances through the kernel's netdev
// generic-netlink family (Linux >= 6.8 reports the poller thread's pid).
//
// Threaded NAPI pollers are named "napi/<dev>-<napi id>", but comm is cut
// at 15 bytes and device names repeat across namespaces, so only the
// (ifindex -> napi id -> pid) mapping the kernel reports identifies the
// thread that polls a given device.
package napi

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nlraw"
	"github.com/lanesnet/lanes/internal/nsx"
)

// From include/uapi/linux/netdev.h (Debian 12's headers predate them).
const (
	cmdNAPIGet  = 11
	attrIfindex = 1
	attrID      = 2
	attrIRQ     = 3
	attrPID     = 4
)

// ErrNoQueue means the device has no such queue (any more).
var ErrNoQueue = errors.New("no such queue")

// ErrUnsupported means the kernel has no netdev NAPI query (Linux < 6.8).
var ErrUnsupported = errors.New("kernel cannot list NAPI instances over netlink (needs Linux >= 6.8)")

// Instance is one NAPI context of a device.
type Instance struct {
	ID      uint32 `json:"id"`
	IfIndex int    `json:"ifindex"`
	IRQ     int    `json:"irq,omitempty"`
	// PID of the poller kthread when the device runs threaded NAPI, else 0.
	PID int `json:"pid,omitempty"`
}

// List returns the NAPI instances of the device with ifindex in netns
// (ifindex 0: every device's).
func List(netns string, ifindex int) ([]Instance, error) { return list(netns, ifindex) }

// IDs returns the ids of the NAPI instances of the device with ifindex in
// netns, sorted.
func IDs(netns string, ifindex int) ([]uint32, error) {
	inst, err := list(netns, ifindex)
	if err != nil {
		return nil, err
	}
	ids := make([]uint32, 0, len(inst))
	for _, in := range inst {
		ids = append(ids, in.ID)
	}
	slices.Sort(ids)
	return ids, nil
}

func list(netns string, ifindex int) ([]Instance, error) {
	msgs, err := dumpAttrs(netns, cmdNAPIGet, "NAPI instances")
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, m := range msgs {
		in := Instance{ID: m[attrID], IfIndex: int(m[attrIfindex]), IRQ: int(int32(m[attrIRQ])), PID: int(m[attrPID])}
		if ifindex == 0 || in.IfIndex == ifindex {
			out = append(out, in)
		}
	}
	return out, nil
}

// dumpAttrs dumps cmd of the netdev family in netns and returns each
// reply's 32-bit attributes by type (what it names, for errors).
func dumpAttrs(netns string, cmd uint8, what string) ([]map[uint16]uint32, error) {
	var out []map[uint16]uint32
	err := nsx.Do(netns, func() error {
		fam, err := netlink.GenlFamilyGet("netdev")
		if err != nil {
			return fmt.Errorf("%w: family lookup: %v", ErrUnsupported, err)
		}
		msgs, err := dump(fam.ID, cmd)
		if err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("%w: listing %s: %w", ErrUnsupported, what, err)
			}
			return fmt.Errorf("listing %s: %w", what, err)
		}
		for _, m := range msgs {
			attrs, err := nl.ParseRouteAttr(m)
			if err != nil {
				return fmt.Errorf("parsing the %s reply: %w", what, err)
			}
			vals := map[uint16]uint32{}
			for _, a := range attrs {
				if len(a.Value) >= 4 {
					vals[a.Attr.Type] = native.Uint32(a.Value[:4])
				}
			}
			out = append(out, vals)
		}
		return nil
	})
	return out, err
}

// dump sends one generic-netlink dump request of cmd (version 1).
// Each reply is returned without its genlmsghdr.
func dump(family uint16, cmd uint8) ([][]byte, error) {
	msgs, err := nlraw.Dump(unix.NETLINK_GENERIC, family, [4]byte{cmd, 1})
	for i := range msgs {
		msgs[i] = msgs[i][4:]
	}
	return msgs, err
}

var native = nlraw.Native

// From include/uapi/linux/netdev.h: queue-get and its attributes.
const (
	cmdQueueGet     = 10
	attrQueueID     = 1
	attrQueueIfidx  = 2
	attrQueueType   = 3
	attrQueueNAPIID = 4
	queueTypeRX     = 0
)

// RxQueueNAPI returns the id of the NAPI instance that polls receive queue
// queue of the device with ifindex in netns (0: the queue has none, as a
// veth's queues while its NAPI is off).
func RxQueueNAPI(netns string, ifindex, queue int) (uint32, error) {
	msgs, err := dumpAttrs(netns, cmdQueueGet, "queues")
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		typ, ok := m[attrQueueType]
		if ok && typ == queueTypeRX && int(m[attrQueueIfidx]) == ifindex && int(m[attrQueueID]) == queue {
			return m[attrQueueNAPIID], nil
		}
	}
	return 0, fmt.Errorf("device %d in %s, receive queue %d: %w", ifindex, nsLabel(netns), queue, ErrNoQueue)
}

// RxNAPIs returns the ids of the NAPI instances in netns that poll a
// receive queue, as drivers that report it (netif_queue_set_napi) name
// them, and the devices (ifindex) whose queues name any: a NAPI instance
// of such a device that is not in rx polls only transmit completions. A
// device whose queues name none (veth) says nothing either way.
func RxNAPIs(netns string) (rx map[uint32]bool, named map[int]bool, err error) {
	msgs, err := dumpAttrs(netns, cmdQueueGet, "queues")
	if err != nil {
		return nil, nil, err
	}
	rx, named = map[uint32]bool{}, map[int]bool{}
	for _, m := range msgs {
		id := m[attrQueueNAPIID]
		if id == 0 {
			continue
		}
		named[int(m[attrQueueIfidx])] = true
		if typ, has := m[attrQueueType]; has && typ == queueTypeRX {
			rx[id] = true
		}
	}
	return rx, named, nil
}

// RxQueueThread returns the pid of the threaded NAPI poller of receive
// queue queue of the device with ifindex in netns, or 0 when the queue has
// no NAPI or its NAPI is not threaded.
//
// Drivers that report it (netif_queue_set_napi) name each queue's NAPI. A
// veth does not (Linux 6.18): it adds one NAPI per receive queue in queue
// order whenever its NAPI is switched on, and NAPI ids are handed out in
// increasing order, so its queue i is polled by its i-th lowest id
// (policy/prism's TestPrismVethQueues checks it with real frames).
func RxQueueThread(netns string, ifindex, queue int) (int, error) {
	id, err := RxQueueNAPI(netns, ifindex, queue)
	if err != nil {
		return 0, err
	}
	inst, err := list(netns, ifindex)
	if err != nil {
		return 0, err
	}
	if id == 0 {
		slices.SortFunc(inst, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
		if queue >= len(inst) {
			return 0, nil
		}
		return inst[queue].PID, nil
	}
	for _, in := range inst {
		if in.ID == id {
			return in.PID, nil
		}
	}
	return 0, nil
}

func nsLabel(ns string) string {
	if ns == "" {
		return "the host namespace"
	}
	return "namespace " + ns
}
