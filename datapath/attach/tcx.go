package attach

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/kver"
	"github.com/lanesnet/lanes/internal/netnsx"
)

// TCX attaches the SCHED_CLS program pinned at Prog to Device's tcx hook
// (Direction "ingress" or "egress") in NetNS through a bpf_link pinned at
// Link. tcx runs several programs in a row, so lanes' program is appended
// after whatever runs there and nothing is refused. Its value is
// ValueAttached when that link is on the device, "" otherwise.
type TCX struct {
	NetNS     string `json:"netns,omitempty"`
	Device    string `json:"device"`
	Direction string `json:"direction"`
	Prog      string `json:"prog"`
	Link      string `json:"link"`
}

func (k *TCX) Kind() string { return KindTCX }

// Key names the hook and the link: tcx runs several of lanes' programs
// on one hook (the fast path's beside Falcon's), each its own knob.
func (k *TCX) Key() string {
	return KindTCX + ":" + nsLabel(k.NetNS) + ":" + k.Device + ":" + k.Direction + knobs.WriterSep + filepath.Base(k.Link)
}
func (k *TCX) String() string {
	return fmt.Sprintf("tcx %s on %s in netns %s", k.Direction, k.Device, nsLabel(k.NetNS))
}

func (k *TCX) attachType() (ebpf.AttachType, error) {
	switch k.Direction {
	case "ingress":
		return ebpf.AttachTCXIngress, nil
	case "egress":
		return ebpf.AttachTCXEgress, nil
	}
	return 0, fmt.Errorf("%s: bad direction %q (use ingress or egress)", k, k.Direction)
}

type tcxState struct {
	ifindex int
	pin     *pinnedLink
	ours    bool
}

// in runs fn inside the namespace with the current state.
func (k *TCX) in(fn func(*tcxState) error) error {
	at, err := k.attachType()
	if err != nil {
		return err
	}
	return netnsx.Do(k.NetNS, func() error {
		idx, _, err := ifindexOf(k.Device)
		if err != nil {
			return err
		}
		s := &tcxState{ifindex: idx}
		if s.pin, err = loadLink(k.Link, link.TCXType); err != nil {
			return err
		}
		defer s.pin.close()
		if x := s.linkInfo(); x != nil && x.Ifindex == uint32(idx) && ebpf.AttachType(x.AttachType) == at {
			// The query runs in this namespace, so finding the link there
			// rules out a namesake ifindex elsewhere.
			q, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: at})
			if err != nil {
				return fmt.Errorf("querying tcx programs of %s: %w", k.Device, err)
			}
			s.ours = slices.ContainsFunc(q.Programs, func(p link.AttachedProgram) bool {
				id, ok := p.LinkID()
				return ok && id == s.pin.info.ID
			})
		}
		return fn(s)
	})
}

func (s *tcxState) linkInfo() *link.TCXInfo {
	if s.pin.l == nil {
		return nil
	}
	return s.pin.info.TCX()
}

func (k *TCX) Read() ([]byte, error) {
	return readLink(k, k.in, func(s *tcxState) bool { return s.ours })
}

func (k *TCX) Write(v []byte) error {
	if _, err := k.attachType(); err != nil {
		return err
	}
	return writeLink(k, v, k.NetNS, k.Device, k.Link, link.TCXType, func() error {
		if err := k.attach(); err != nil {
			return fmt.Errorf("attaching %s: %w", k, err)
		}
		return nil
	})
}

func (k *TCX) attach() error {
	at, err := k.attachType()
	if err != nil {
		return err
	}
	return k.in(func(s *tcxState) error {
		prog, err := loadProg(k.Prog, ebpf.SchedCLS)
		if err != nil {
			return err
		}
		defer prog.Close()
		if s.ours {
			return s.pin.update(prog)
		}
		var ifindex uint32
		if x := s.linkInfo(); x != nil {
			ifindex = x.Ifindex
		}
		if err := s.pin.clearStale(ifindex); err != nil {
			return err
		}
		// No anchor: the kernel appends, after programs others attached.
		l, err := link.AttachTCX(link.TCXOptions{Interface: s.ifindex, Program: prog, Attach: at})
		if err != nil {
			return tcxError(err)
		}
		defer l.Close()
		if err := l.Pin(k.Link); err != nil {
			return fmt.Errorf("pinning link at %s (left unattached): %w", k.Link, err)
		}
		return nil
	})
}

// tcxError says what a failed tcx attach means when the kernel has no tcx
// links (cilium/ebpf probes for them once an attach fails, so a kernel
// with tcx backported is not refused by its version).
func tcxError(err error) error {
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	rel, _ := kver.Release()
	return fmt.Errorf("tcx links need Linux 6.6 or newer or a backport (this kernel: %s): %w", rel, err)
}
