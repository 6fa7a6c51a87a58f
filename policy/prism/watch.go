package prism

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/netnsx"
)

// The sync agent's watch: netlink notifications from every namespace on
// the shortcut's path. A change that may make a destination unsafe (a
// filter, a route, an address, a link, a tc filter, IPsec, a forwarding
// entry of a destination or source) withdraws every destination at once,
// before the agent looks again; anything else on the bridge (a MAC
// learned) only makes it look again. nftables, tc, links, routes and
// forwarding entries announce their changes; legacy iptables and
// ebtables do not, and tcx and XDP attachments neither: the agent's
// interval catches those.

// Netlink groups (linux/rtnetlink.h, linux/netfilter/nfnetlink.h,
// linux/xfrm.h).
const (
	rtnlGrpLink       = 1
	rtnlGrpNeigh      = 3
	rtnlGrpTC         = 4
	rtnlGrpIPv4Ifaddr = 5
	rtnlGrpIPv4Route  = 7
	rtnlGrpIPv4Rule   = 8
	nfnlGrpNFTables   = 7
	xfrmGrpSA         = 3
	xfrmGrpPolicy     = 4
)

// watchEvent is what a notification means for the shortcut.
type watchEvent struct {
	withdraw bool   // a destination may be unsafe now: withdraw first
	why      string // for status and logs
}

// shortcutMACs are the MACs the shortcut goes by.
type shortcutMACs struct {
	targets, sources map[string]bool
}

// classify reads one notification (proto: its socket's protocol) against
// the MACs the shortcut uses. A destination's forwarding entry changing
// at all withdraws (the MAC may have moved to another port), and so does
// a source's VXLAN entry (its VTEP, which the datapath checks); a
// source's bridge entry changing (ageing out, say) only makes the agent
// look again: the datapath's check does not depend on it, and a source
// the bridge no longer has leaves the set then.
func classify(proto int, m syscall.NetlinkMessage, macs shortcutMACs) watchEvent {
	switch proto {
	case unix.NETLINK_NETFILTER:
		return watchEvent{true, "an nftables change"}
	case unix.NETLINK_XFRM:
		return watchEvent{true, "an IPsec change"}
	}
	switch m.Header.Type {
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		// struct ndmsg: family, pad, pad, ifindex, state, flags, type.
		if len(m.Data) < 12 || m.Data[0] != unix.AF_BRIDGE {
			return watchEvent{} // IP neighbours: not on the shortcut's path
		}
		attrs, err := nl.ParseRouteAttr(m.Data[12:])
		if err != nil {
			return watchEvent{true, "an unreadable forwarding entry"}
		}
		self := m.Data[10]&unix.NTF_SELF != 0
		for _, a := range attrs {
			if a.Attr.Type != unix.NDA_LLADDR {
				continue
			}
			mac := net.HardwareAddr(a.Value).String()
			if macs.targets[mac] || self && macs.sources[mac] {
				return watchEvent{true, "the forwarding entry of " + mac + " changed"}
			}
		}
		return watchEvent{why: "a forwarding entry changed"}
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		return watchEvent{true, "a link changed"}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		return watchEvent{true, "an address changed"}
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return watchEvent{true, "a route changed"}
	case unix.RTM_NEWQDISC, unix.RTM_DELQDISC, unix.RTM_NEWTFILTER, unix.RTM_DELTFILTER,
		unix.RTM_NEWCHAIN, unix.RTM_DELCHAIN:
		return watchEvent{true, "a tc filter or qdisc changed"}
	}
	return watchEvent{why: fmt.Sprintf("netlink message %d", m.Header.Type)}
}

// watcher holds the subscriptions of a set of namespaces: one reader a
// subscription, and one goroutine that stops it with its context, all
// ended by close.
type watcher struct {
	events chan watchEvent
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	macs   shortcutMACs
	socks  []*nl.NetlinkSocket
	err    error // the first subscription that failed (broken)
	wg     sync.WaitGroup
}

// testWatched, when set, is told of each watcher watch makes;
// testSubscribe runs before watch subscribes, and its error is watch's.
var (
	testWatched   func(w *watcher)
	testSubscribe atomic.Pointer[func(namespaces []string) error]
)

// watch subscribes in each namespace (deduplicated); it fails if any
// subscription does (the caller then writes no destination until one
// holds, and says so).
// count (nil: none) is given each nftables and IPsec socket, to count the
// changes the kernel announces there as it announces them, before the
// process that made one gets its answer (steer.Sync.CountChanges).
func watch(ctx context.Context, namespaces []string, count func(fd int) error) (*watcher, error) {
	if f := testSubscribe.Load(); f != nil {
		if err := (*f)(namespaces); err != nil {
			return nil, err
		}
	}
	w := &watcher{events: make(chan watchEvent, 64), done: make(chan struct{})}
	subs := []struct {
		proto  int
		groups []uint
	}{
		{unix.NETLINK_ROUTE, []uint{rtnlGrpLink, rtnlGrpNeigh, rtnlGrpTC, rtnlGrpIPv4Ifaddr, rtnlGrpIPv4Route, rtnlGrpIPv4Rule}},
		{unix.NETLINK_NETFILTER, []uint{nfnlGrpNFTables}},
		{unix.NETLINK_XFRM, []uint{xfrmGrpSA, xfrmGrpPolicy}},
	}
	seen := map[string]bool{}
	for _, ns := range namespaces {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		for _, sub := range subs {
			var s *nl.NetlinkSocket
			err := netnsx.Do(ns, func() error {
				var err error
				s, err = nl.Subscribe(sub.proto, sub.groups...)
				if err == nil && count != nil && sub.proto != unix.NETLINK_ROUTE {
					if err = count(s.GetFd()); err != nil {
						s.Close()
					}
				}
				return err
			})
			if err != nil {
				w.close()
				return nil, fmt.Errorf("subscribing to netlink protocol %d in %s: %w", sub.proto, label(ns), err)
			}
			w.socks = append(w.socks, s)
			w.wg.Add(1)
			go w.read(s, sub.proto)
		}
	}
	w.wg.Go(func() {
		select {
		case <-ctx.Done():
			w.stop()
		case <-w.done:
		}
	})
	if testWatched != nil {
		testWatched(w)
	}
	return w, nil
}

// setMACs sets the MACs whose forwarding entries matter.
func (w *watcher) setMACs(macs shortcutMACs) {
	w.mu.Lock()
	w.macs = macs
	w.mu.Unlock()
}

func (w *watcher) read(s *nl.NetlinkSocket, proto int) {
	defer w.wg.Done()
	for {
		msgs, _, err := s.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				// The kernel dropped notifications: any of them may
				// have mattered.
				w.send(watchEvent{true, "netlink notifications were lost (socket overflow)"})
				continue
			}
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			select {
			case <-w.done:
				return // closed
			default:
			}
			// Changes on this subscription go unseen from here: the
			// shortcut cannot be vouched for until the agent subscribes
			// again (it does, on this event).
			w.mu.Lock()
			if w.err == nil {
				w.err = fmt.Errorf("reading %s notifications: %w", protoName(proto), err)
			}
			w.mu.Unlock()
			w.send(watchEvent{true, fmt.Sprintf("the netlink watch failed (%s: %v)", protoName(proto), err)})
			return
		}
		w.mu.Lock()
		macs := w.macs
		w.mu.Unlock()
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_DONE || m.Header.Type == unix.NLMSG_ERROR {
				continue
			}
			w.send(classify(proto, m, macs))
		}
	}
}

// protoName names a netlink protocol the watch subscribes to.
func protoName(proto int) string {
	switch proto {
	case unix.NETLINK_ROUTE:
		return "rtnetlink"
	case unix.NETLINK_NETFILTER:
		return "nfnetlink"
	case unix.NETLINK_XFRM:
		return "xfrm"
	}
	return fmt.Sprintf("netlink protocol %d", proto)
}

// send delivers ev, or, with the channel full, makes sure a withdrawal
// is not lost behind lesser events.
func (w *watcher) send(ev watchEvent) {
	select {
	case w.events <- ev:
		return
	default:
	}
	if ev.withdraw {
		select {
		case w.events <- ev:
		case <-w.done:
		}
	}
}

// broken is the error of the first subscription that failed (nil: all
// read).
func (w *watcher) broken() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// stop ends the subscriptions: their readers return.
func (w *watcher) stop() {
	w.once.Do(func() { close(w.done) })
	w.mu.Lock()
	socks := w.socks
	w.socks = nil
	w.mu.Unlock()
	for _, s := range socks {
		s.Close()
	}
}

// close stops the subscriptions and waits for their goroutines.
func (w *watcher) close() {
	w.stop()
	w.wg.Wait()
}
