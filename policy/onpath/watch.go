package onpath

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

// The watch: netlink notifications from every namespace on a shortcut's
// path. A change that may make what an agent vouched for unsafe (a
// filter, a route, an address, a link, a tc filter, IPsec, a forwarding
// entry of a MAC it goes by) is a withdrawal, which the agent acts on at
// once, before it looks again; anything else on the bridge (a MAC
// learned) only makes it look again. nftables, tc, links, routes and
// forwarding entries, and the forwarding and reverse path filtering
// sysctls (netconf) announce their changes; legacy iptables and
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
	rtnlGrpIPv4Netcf  = 24
	nfnlGrpNFTables   = 7
	xfrmGrpSA         = 3
	xfrmGrpPolicy     = 4
)

// Event is what a notification means for the shortcut.
type Event struct {
	Withdraw bool   // what the agent vouched for may be unsafe now: withdraw first
	Why      string // for status and logs
}

// MACs are the MACs a shortcut goes by: the destinations' and the
// sources'.
type MACs struct {
	Targets, Sources map[string]bool
}

// Classify reads one notification (proto: its socket's protocol) against
// the MACs the shortcut uses. A destination's forwarding entry changing
// at all withdraws (the MAC may have moved to another port), and so does
// a source's VXLAN entry (its VTEP, which the datapath checks); a
// source's bridge entry changing (ageing out, say) only makes the agent
// look again: the datapath's check does not depend on it, and a source
// the bridge no longer has leaves the set then.
func Classify(proto int, m syscall.NetlinkMessage, macs MACs) Event {
	switch proto {
	case unix.NETLINK_NETFILTER:
		return Event{true, "an nftables change"}
	case unix.NETLINK_XFRM:
		return Event{true, "an IPsec change"}
	}
	switch m.Header.Type {
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		// struct ndmsg: family, pad, pad, ifindex, state, flags, type.
		if len(m.Data) < 12 || m.Data[0] != unix.AF_BRIDGE {
			return Event{} // IP neighbours: not on the shortcut's path
		}
		attrs, err := nl.ParseRouteAttr(m.Data[12:])
		if err != nil {
			return Event{true, "an unreadable forwarding entry"}
		}
		self := m.Data[10]&unix.NTF_SELF != 0
		for _, a := range attrs {
			if a.Attr.Type != unix.NDA_LLADDR {
				continue
			}
			mac := net.HardwareAddr(a.Value).String()
			if macs.Targets[mac] || self && macs.Sources[mac] {
				return Event{true, "the forwarding entry of " + mac + " changed"}
			}
		}
		return Event{Why: "a forwarding entry changed"}
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		return Event{true, "a link changed"}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		return Event{true, "an address changed"}
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return Event{true, "a route changed"}
	case unix.RTM_NEWNETCONF, unix.RTM_DELNETCONF:
		return Event{true, "forwarding or reverse path filtering changed"}
	case unix.RTM_NEWQDISC, unix.RTM_DELQDISC, unix.RTM_NEWTFILTER, unix.RTM_DELTFILTER,
		unix.RTM_NEWCHAIN, unix.RTM_DELCHAIN:
		return Event{true, "a tc filter or qdisc changed"}
	}
	return Event{Why: fmt.Sprintf("netlink message %d", m.Header.Type)}
}

// Watcher holds the subscriptions of a set of namespaces: one reader a
// subscription, and one goroutine that stops it with its context, all
// ended by Close.
type Watcher struct {
	events chan Event
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	macs   MACs
	socks  []*nl.NetlinkSocket
	err    error // the first subscription that failed (broken)
	wg     sync.WaitGroup
}

// testWatched, when set, is told of each watcher Watch makes;
// testSubscribe runs before Watch subscribes, and its error is Watch's.
var (
	testWatched   atomic.Pointer[func(w *Watcher)]
	testSubscribe atomic.Pointer[func(namespaces []string) error]
)

// Watch subscribes in each namespace (deduplicated); it fails if any
// subscription does (the caller then vouches for nothing until one
// holds, and says so).
// count (nil: none) is given each nftables and IPsec socket, to count the
// changes the kernel announces there as it announces them, before the
// process that made one gets its answer (steer.Datapath.CountChanges).
func Watch(ctx context.Context, namespaces []string, count func(fd int) error) (*Watcher, error) {
	if f := testSubscribe.Load(); f != nil {
		if err := (*f)(namespaces); err != nil {
			return nil, err
		}
	}
	w := &Watcher{events: make(chan Event, 64), done: make(chan struct{})}
	subs := []struct {
		proto  int
		groups []uint
	}{
		{unix.NETLINK_ROUTE, []uint{rtnlGrpLink, rtnlGrpNeigh, rtnlGrpTC, rtnlGrpIPv4Ifaddr, rtnlGrpIPv4Route, rtnlGrpIPv4Rule, rtnlGrpIPv4Netcf}},
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
				w.Close()
				return nil, fmt.Errorf("subscribing to netlink protocol %d in %s: %w", sub.proto, Label(ns), err)
			}
			w.socks = append(w.socks, s)
			w.wg.Add(1)
			go w.read(s, sub.proto)
		}
	}
	w.wg.Go(func() {
		select {
		case <-ctx.Done():
			w.Stop()
		case <-w.done:
		}
	})
	if f := testWatched.Load(); f != nil {
		(*f)(w)
	}
	return w, nil
}

// Events are the notifications, classified (Classify), until Done.
func (w *Watcher) Events() <-chan Event { return w.events }

// Done is closed once the watch stopped (Stop, Close, or its context).
func (w *Watcher) Done() <-chan struct{} { return w.done }

// SetMACs sets the MACs whose forwarding entries matter.
func (w *Watcher) SetMACs(macs MACs) {
	w.mu.Lock()
	w.macs = macs
	w.mu.Unlock()
}

func (w *Watcher) read(s *nl.NetlinkSocket, proto int) {
	defer w.wg.Done()
	for {
		msgs, _, err := s.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				// The kernel dropped notifications: any of them may
				// have mattered.
				w.send(Event{true, "netlink notifications were lost (socket overflow)"})
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
			w.send(Event{true, fmt.Sprintf("the netlink watch failed (%s: %v)", protoName(proto), err)})
			return
		}
		w.mu.Lock()
		macs := w.macs
		w.mu.Unlock()
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_DONE || m.Header.Type == unix.NLMSG_ERROR {
				continue
			}
			w.send(Classify(proto, m, macs))
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
func (w *Watcher) send(ev Event) {
	select {
	case w.events <- ev:
		return
	default:
	}
	if ev.Withdraw {
		select {
		case w.events <- ev:
		case <-w.done:
		}
	}
}

// Broken is the error of the first subscription that failed (nil: all
// read).
func (w *Watcher) Broken() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Stop ends the subscriptions: their readers return.
func (w *Watcher) Stop() {
	w.once.Do(func() { close(w.done) })
	w.mu.Lock()
	socks := w.socks
	w.socks = nil
	w.mu.Unlock()
	for _, s := range socks {
		s.Close()
	}
}

// Close stops the subscriptions and waits for their goroutines.
func (w *Watcher) Close() {
	w.Stop()
	w.wg.Wait()
}
