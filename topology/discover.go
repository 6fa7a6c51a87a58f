package topology

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/mountinfo"
	"github.com/lanesnet/lanes/internal/napi"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DockerNetNSDir is where Docker binds its container and overlay namespaces.
const DockerNetNSDir = "/var/run/docker/netns"

// Discover finds the overlay whose VXLAN device lives in namespace ns (""
// = the namespace lanes runs in).
func Discover(ns string) (*Topology, error) { return discover(ns, true) }

// DiscoverPath is Discover reading only what lies on a frame's path: the
// devices, their addresses, MTUs, GRO, queue counts and hooks, bridges,
// ports and forwarding tables, routes, netfilter, the containers behind
// the veths. It leaves out what placing the receive stages needs and the
// path does not: NAPI threads and instances, interrupts, the receive
// queues' RPS settings (RxQueues lists the queues, RPS empty), XPS,
// channel maxima, UDP GRO features, XDP redirect targets (those Device
// fields stay zero). PRISM-sync's agent reads the path every second, on
// the cores the receive path and its applications run on.
func DiscoverPath(ns string) (*Topology, error) { return discover(ns, false) }

// discover is Discover, or DiscoverPath where full is false.
func discover(ns string, full bool) (*Topology, error) {
	if !netnsx.Exists(ns) {
		return nil, netnsx.NotFoundError(ns)
	}
	cat, err := openCatalog()
	if err != nil {
		return nil, err
	}
	defer cat.close()

	d := &discovery{cat: cat, scans: map[string]*nsScan{}, full: full}
	host, err := d.scan(ns)
	if err != nil {
		return nil, err
	}
	var asked *string
	if !hasVXLAN(host) {
		over, err := d.overlayFor(ns)
		if err != nil {
			return nil, err
		}
		if over == nil {
			return nil, &noOverlayError{ns: ns}
		}
		if host, err = d.scan(*over); err != nil {
			return nil, err
		}
		host0 := ns
		asked, ns = &host0, *over
	}
	t := &Topology{NetNS: ns, Host: asked, VXLANs: []VXLAN{}, Underlays: []Device{}, Bridges: []Bridge{}, Veths: []Veth{}, Containers: []Container{}, Netfilter: host.path.netfilter}
	for _, l := range host.links {
		if vx, ok := l.(*netlink.Vxlan); ok {
			t.VXLANs = append(t.VXLANs, d.vxlan(host, vx))
		}
	}
	if err := d.underlays(t); err != nil {
		return nil, err
	}
	isUnderlay := map[string]bool{}
	for _, u := range t.Underlays {
		if u.NetNS == ns {
			isUnderlay[u.Name] = true
		}
	}
	for _, l := range host.links {
		a := l.Attrs()
		switch l.Type() {
		case "bridge":
			f := host.path.bridges[a.Name]
			b := Bridge{Device: host.device(l), Ports: []string{}, VLANFiltering: f.vlanFiltering, STP: f.stp, NFCallIPTables: f.nfCall, FDB: host.path.fdb[a.Index]}
			for _, p := range host.links {
				if p.Attrs().MasterIndex == a.Index {
					b.Ports = append(b.Ports, p.Attrs().Name)
					if bp, ok := host.path.brports[p.Attrs().Name]; ok {
						b.PortInfo = append(b.PortInfo, bp)
					}
				}
			}
			t.Bridges = append(t.Bridges, b)
		case "veth":
			if isUnderlay[a.Name] {
				continue
			}
			// A pair with both ends here is no container link unless a
			// bridge carries it; the far end of a veth underlay is not one.
			if a.NetNsID < 0 {
				peer := host.byIndex[a.ParentIndex]
				if a.MasterIndex == 0 || peer == nil || isUnderlay[peer.Attrs().Name] {
					continue
				}
			}
			v := Veth{Device: host.device(l), PeerIndex: a.ParentIndex, PeerNetNS: ns}
			if m := host.byIndex[a.MasterIndex]; m != nil {
				v.Master = m.Attrs().Name
			}
			if a.NetNsID >= 0 {
				v.PeerNetNS = host.nsName(a.NetNsID)
			}
			// A link into lanes' own namespace (a testbed's management
			// link) leads to no container, unless a bridge carries it.
			if v.PeerNetNS == "" && ns != "" && a.MasterIndex == 0 {
				continue
			}
			t.Veths = append(t.Veths, v)
		}
	}
	if err := d.containers(t); err != nil {
		return nil, err
	}
	t.Kind = classify(t)
	if !full {
		return t, nil
	}
	if err := d.napiThreads(t); err != nil {
		return nil, err
	}
	return t, nil
}

func hasVXLAN(s *nsScan) bool {
	for _, l := range s.links {
		if _, ok := l.(*netlink.Vxlan); ok {
			return true
		}
	}
	return false
}

// overlayFor finds the namespace of the overlay whose underlay is in ns,
// for a namespace without a VXLAN device of its own: a Docker host keeps
// each overlay network's VXLAN device and bridge in a namespace bound
// under dockerd's exec-root, the device made in the host's namespace and
// moved there, so its socket and underlay stay in the host's. It looks
// through every bound namespace (the catalog) for VXLAN devices whose link
// namespace is ns. Nil when there is none; an error naming them all when
// several are (one per Docker overlay network).
func (d *discovery) overlayFor(ns string) (*string, error) {
	h, err := netnsx.Open(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var self unix.Stat_t
	if err := unix.Fstat(int(h), &self); err != nil {
		return nil, err
	}
	var sboxes []*os.File
	for _, n := range d.cat.named {
		if filepath.Base(n.name) == dockerIngressSandbox {
			sboxes = append(sboxes, n.f)
		}
	}
	var found, ingress []string
	for _, n := range d.cat.named {
		if n.ino == self.Ino {
			continue
		}
		var uses, isIngress bool
		err := nsx.DoHandle(netns.NsHandle(n.f.Fd()), func() error {
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			host, err := netlink.GetNetNsIdByFd(int(h))
			if err != nil {
				return err
			}
			for _, l := range links {
				id := l.Attrs().NetNsID
				if _, ok := l.(*netlink.Vxlan); ok && id >= 0 && id == host {
					uses = true
				}
				if l.Type() != "veth" || id < 0 {
					continue
				}
				for _, f := range sboxes {
					if sid, err := netlink.GetNetNsIdByFd(int(f.Fd())); err == nil && sid == id {
						isIngress = true
					}
				}
			}
			return nil
		})
		switch {
		case err != nil || !uses:
		case isIngress:
			ingress = append(ingress, n.name)
		default:
			found = append(found, n.name)
		}
	}
	if len(found) == 0 {
		found = ingress
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return &found[0], nil
	}
	return nil, &severalOverlaysError{ns: ns, nss: found}
}

// dockerIngressSandbox is the namespace file of a swarm node's ingress
// sandbox (libnetwork's name), whose veth is the only port, besides the
// VXLAN device, of the ingress network's bridge: the routing mesh's
// overlay, which carries no container's traffic. Discovery passes it over
// when the host has another overlay.
const dockerIngressSandbox = "ingress_sbox"

type discovery struct {
	cat   *catalog
	scans map[string]*nsScan
	full  bool // Discover, not DiscoverPath
}

func (d *discovery) scan(ns string) (*nsScan, error) {
	if s := d.scans[ns]; s != nil {
		return s, nil
	}
	s, err := scanNetNS(ns, d.cat, d.full)
	if err != nil {
		return nil, err
	}
	d.scans[ns] = s
	return s, nil
}

func (d *discovery) vxlan(s *nsScan, l *netlink.Vxlan) VXLAN {
	v := VXLAN{
		Device:        s.device(l),
		VNI:           l.VxlanId,
		Port:          l.Port,
		Learning:      l.Learning,
		External:      l.FlowBased,
		GBP:           l.GBP,
		UnderlayNetNS: s.ns,
		Addrs:         s.addrs[l.Index],
	}
	v.Local, _ = netip.AddrFromSlice(l.SrcAddr)
	v.Local = v.Local.Unmap()
	v.Remote, _ = netip.AddrFromSlice(l.Group)
	v.Remote = v.Remote.Unmap()
	if v.Local.IsUnspecified() {
		v.Local = netip.Addr{}
	}
	if v.Remote.IsUnspecified() {
		v.Remote = netip.Addr{}
	}
	v.FDB = s.fdb[l.Index]
	v.SrcPorts = s.localPorts
	if l.PortLow < l.PortHigh {
		v.SrcPorts = [2]int{l.PortLow, l.PortHigh}
	}
	if m := s.byIndex[l.MasterIndex]; m != nil {
		v.Master = m.Attrs().Name
	}
	// A bridge port with a routable address still routes; link-local
	// addresses come with any up device and say nothing.
	v.L3 = v.Master == ""
	for _, a := range v.Addrs {
		if !a.Addr().IsLinkLocalUnicast() {
			v.L3 = true
		}
	}
	// The VXLAN socket and its `dev` live in the namespace the device was
	// created in, which IFLA_LINK_NETNSID names when it was moved since.
	if l.NetNsID >= 0 {
		v.UnderlayNetNS = s.nsName(l.NetNsID)
	}
	return v
}

// underlays resolves each VXLAN's underlay device: its `dev`, else the
// device of the route to a remote VTEP, else the device holding its local
// address.
func (d *discovery) underlays(t *Topology) error {
	seen := map[string]bool{}
	for i := range t.VXLANs {
		v := &t.VXLANs[i]
		if v.UnderlayNetNS == "unknown" {
			t.Notes = append(t.Notes, fmt.Sprintf("vxlan %s: its underlay namespace is held by no name and no process lanes can see; underlay not resolved", v.Name))
			continue
		}
		us, err := d.scan(v.UnderlayNetNS)
		if err != nil {
			t.Notes = append(t.Notes, fmt.Sprintf("vxlan %s: cannot read underlay namespace %s: %v", v.Name, label(v.UnderlayNetNS), err))
			continue
		}
		l := d.resolveUnderlay(t, us, v)
		if l == nil {
			t.Notes = append(t.Notes, fmt.Sprintf("vxlan %s: underlay device not found (no dev, no route to a remote VTEP, no device with its local address)", v.Name))
			continue
		}
		v.Underlay = l.Attrs().Name
		if us != d.scans[t.NetNS] {
			nf := us.path.netfilter
			v.UnderlayNetfilter = &nf
		}
		key := us.ns + "\x00" + v.Underlay
		if !seen[key] {
			seen[key] = true
			dev := us.device(l)
			if d.full && mayHaveIRQs(l, us.napiInst) {
				dev.IRQs = describeIRQs(deviceIRQs(us.ns, us.napiInst, dev.Index, dev.Name))
			}
			t.Underlays = append(t.Underlays, dev)
		}
	}
	return nil
}

func (d *discovery) resolveUnderlay(t *Topology, us *nsScan, v *VXLAN) netlink.Link {
	vl := d.scans[t.NetNS].byName[v.Name].(*netlink.Vxlan)
	if vl.VtepDevIndex > 0 {
		if l := us.byIndex[vl.VtepDevIndex]; l != nil {
			v.Dev = l.Attrs().Name
			v.How = "dev"
			return l
		}
	}
	var dsts []netip.Addr
	if v.Remote.IsValid() {
		dsts = append(dsts, v.Remote)
	}
	dsts = append(dsts, v.FDB...)
	for _, dst := range dsts {
		idx, err := routeDev(us.ns, dst, v.Local)
		if err != nil {
			continue
		}
		if l := us.byIndex[idx]; l != nil && l.Attrs().Flags&net.FlagLoopback == 0 {
			v.How = "route to " + dst.String()
			return l
		}
	}
	if v.Local.IsValid() {
		for idx, ps := range us.addrs {
			for _, p := range ps {
				if p.Addr() == v.Local {
					v.How = "local address " + v.Local.String()
					return us.byIndex[idx]
				}
			}
		}
	}
	return nil
}

func routeDev(ns string, dst, src netip.Addr) (int, error) {
	var idx int
	err := netnsx.Do(ns, func() error {
		opts := &netlink.RouteGetOptions{}
		if src.IsValid() {
			opts.SrcAddr = net.IP(src.AsSlice())
		}
		rs, err := netlink.RouteGetWithOptions(net.IP(dst.AsSlice()), opts)
		if err != nil && src.IsValid() {
			// The local address may not be configured (yet); route without it.
			rs, err = netlink.RouteGet(net.IP(dst.AsSlice()))
		}
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			return errors.New("no route")
		}
		idx = rs[0].LinkIndex
		return nil
	})
	return idx, err
}

// containers scans the namespace behind each host-side veth.
func (d *discovery) containers(t *Topology) error {
	byNS := map[string]*Container{}
	var order []string
	for i := range t.Veths {
		v := &t.Veths[i]
		ns := v.PeerNetNS
		if ns == t.NetNS || ns == "" || ns == "unknown" {
			continue
		}
		cs, err := d.scan(ns)
		if err != nil {
			t.Notes = append(t.Notes, fmt.Sprintf("veth %s: cannot read peer namespace %s: %v", v.Name, label(ns), err))
			continue
		}
		c := byNS[ns]
		if c == nil {
			c = &Container{NetNS: ns, Interfaces: []Interface{}}
			for _, l := range cs.links {
				if l.Attrs().Flags&net.FlagLoopback != 0 || fallbackTunnel(l) {
					continue
				}
				c.Interfaces = append(c.Interfaces, Interface{Device: cs.device(l), Addrs: cs.addrs[l.Attrs().Index]})
			}
			byNS[ns] = c
			order = append(order, ns)
		}
		for j := range c.Interfaces {
			if c.Interfaces[j].Index == v.PeerIndex {
				c.Interfaces[j].HostVeth = v.Name
				v.PeerName = c.Interfaces[j].Name
			}
		}
	}
	for _, ns := range order {
		t.Containers = append(t.Containers, *byNS[ns])
	}
	return nil
}

// fallbackTunnels are the devices the kernel creates in every namespace
// once a tunnel driver is loaded or built in (sit0 with IPv6's SIT, tunl0
// with IPIP, as on hosts of Calico's IPIP mode, ...), by link type. They
// carry nothing until configured, so they are not a container's
// interfaces (on a kernel with SIT built in every container has sit0,
// listed first).
var fallbackTunnels = map[string]string{
	"sit": "sit0", "ipip": "tunl0", "ip6tnl": "ip6tnl0", "gre": "gre0", "gretap": "gretap0",
	"erspan": "erspan0", "vti": "ip_vti0", "vti6": "ip6_vti0", "ip6gre": "ip6gre0",
}

// fallbackTunnel says whether l is such a device, left down as created.
func fallbackTunnel(l netlink.Link) bool {
	a := l.Attrs()
	return fallbackTunnels[l.Type()] == a.Name && a.Flags&net.FlagUp == 0
}

func classify(t *Topology) Kind {
	bridgeOf := map[string]bool{}
	for _, b := range t.Bridges {
		bridgeOf[b.Name] = true
	}
	for _, v := range t.VXLANs {
		if bridgeOf[v.Master] {
			return Docker
		}
	}
	for _, v := range t.Veths {
		if bridgeOf[v.Master] {
			return Flannel
		}
	}
	return Routed
}

var napiComm = regexp.MustCompile(`^napi/(.+)-[0-9]+$`)

// napiThreads attaches each device's NAPI kernel threads: by pid from the
// netdev family where it lists them, by name otherwise.
func (d *discovery) napiThreads(t *Topology) error {
	ths, err := kthread.List(func(c string) bool { return napiComm.MatchString(c) })
	if err != nil {
		return err
	}
	byPID := map[int]kthread.Info{}
	for _, th := range ths {
		byPID[th.PID] = th
	}
	byName := false
	for _, dev := range t.AllDevices() {
		s := d.scans[dev.NetNS]
		if s == nil {
			continue
		}
		pids, listed := s.napi[dev.Index]
		for _, pid := range pids {
			if th, ok := byPID[pid]; ok {
				dev.NAPIThreads = append(dev.NAPIThreads, th)
			}
		}
		// Fall back to names only for NAPI instances the netdev family
		// does not list (VXLAN's GRO cells have no NAPI id) or when it
		// could not be asked: a name can belong to another namespace.
		if listed || !dev.ThreadedNAPI() {
			continue
		}
		for _, th := range ths {
			if m := napiComm.FindStringSubmatch(th.Comm); m != nil && m[1] == dev.Name {
				dev.NAPIThreads = append(dev.NAPIThreads, th)
				dev.NAPIByName = true
				byName = true
			}
		}
	}
	if byName {
		t.Notes = append(t.Notes, "some NAPI threads were matched by name only (VXLAN GRO cells have no NAPI id): a same-named device in another namespace would match too")
	}
	var nss []string
	for ns, s := range d.scans {
		if s.napiErr != nil {
			nss = append(nss, ns)
		}
	}
	sort.Strings(nss)
	for _, ns := range nss {
		t.Notes = append(t.Notes, fmt.Sprintf("netns %s: NAPI threads matched by name: %v", label(ns), d.scans[ns].napiErr))
	}
	return nil
}

// catalog holds the named namespaces, open, so their ids can be asked from
// inside any namespace.
type catalog struct {
	root  *os.File
	named []nsFile
}

type nsFile struct {
	name string
	f    *os.File
	ino  uint64
}

func openCatalog() (*catalog, error) {
	// thread-self: this goroutine's thread is one the runtime never moved
	// to another namespace (nsx discards those threads).
	root, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("opening own netns: %w", err)
	}
	c := &catalog{root: root}
	add := func(name, path string) {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) != nil {
			f.Close()
			return
		}
		c.named = append(c.named, nsFile{name: name, f: f, ino: st.Ino})
	}
	if ents, err := os.ReadDir(nsx.Dir); err == nil {
		for _, e := range ents {
			add(e.Name(), nsx.Path(e.Name()))
		}
	}
	if ents, err := os.ReadDir(DockerNetNSDir); err == nil {
		for _, e := range ents {
			add(filepath.Join(DockerNetNSDir, e.Name()), filepath.Join(DockerNetNSDir, e.Name()))
		}
	}
	// Every other namespace bound to a file, wherever its owner keeps
	// them: a dockerd with another exec-root, containerd's CNI
	// namespaces, a second iproute2 directory. Bind mounts of a network
	// namespace are nsfs mounts whose root is "net:[INODE]".
	seen := map[uint64]bool{}
	for _, n := range c.named {
		seen[n.ino] = true
	}
	ms, _ := mountinfo.Read()
	for _, p := range mountinfo.NetNS(ms) {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		add(p, p)
	}
	return c, nil
}

func (c *catalog) close() {
	c.root.Close()
	for _, n := range c.named {
		n.f.Close()
	}
}

// nsScan is everything read from one namespace in one visit.
type nsScan struct {
	ns       string
	links    []netlink.Link
	byIndex  map[int]netlink.Link
	byName   map[string]netlink.Link
	addrs    map[int][]netip.Prefix
	fdb      map[int][]netip.Addr
	threaded map[string]string
	queues   map[string][]RxQueue
	// napi is the netdev family's view: ifindex -> NAPI instances with
	// their thread pids (0 when not threaded); nil when the dump failed.
	napi    map[int][]int
	napiErr error
	// napiInst are the netdev family's NAPI instances, for the
	// underlays' interrupts (deviceIRQs); nil when the dump failed.
	napiInst []napi.Instance
	nsids    map[int]string // peer netns id (as this namespace numbers them) -> name
	path     pathScan
	// localPorts is the namespace's ip_local_port_range (zero if unread).
	localPorts [2]int
}

// scanNetNS reads namespace ns; all of it where full, its path otherwise
// (DiscoverPath).
func scanNetNS(ns string, cat *catalog, full bool) (*nsScan, error) {
	s := &nsScan{
		ns:       ns,
		byIndex:  map[int]netlink.Link{},
		byName:   map[string]netlink.Link{},
		addrs:    map[int][]netip.Prefix{},
		fdb:      map[int][]netip.Addr{},
		threaded: map[string]string{},
		queues:   map[string][]RxQueue{},
		nsids:    map[int]string{},
	}
	err := netnsx.SysfsAt(ns, func(sys string) error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("listing links: %w", err)
		}
		sort.Slice(links, func(i, j int) bool { return links[i].Attrs().Index < links[j].Attrs().Index })
		s.links = links
		wantIDs := map[int]bool{}
		for _, l := range links {
			a := l.Attrs()
			s.byIndex[a.Index] = l
			s.byName[a.Name] = l
			addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
			if err == nil {
				for _, ad := range addrs {
					if p, ok := prefixOf(ad.IPNet); ok {
						s.addrs[a.Index] = append(s.addrs[a.Index], p)
					}
				}
			}
			if _, ok := l.(*netlink.Vxlan); ok {
				neighs, err := netlink.NeighList(a.Index, unix.AF_BRIDGE)
				if err == nil {
					for _, n := range neighs {
						if ip, ok := netip.AddrFromSlice(n.IP); ok && !ip.IsUnspecified() {
							ip = ip.Unmap()
							if !slices.Contains(s.fdb[a.Index], ip) {
								s.fdb[a.Index] = append(s.fdb[a.Index], ip)
							}
						}
					}
				}
			}
			if full {
				if b, err := os.ReadFile(sys + "/class/net/" + a.Name + "/threaded"); err == nil {
					s.threaded[a.Name] = strings.TrimSpace(string(b))
				}
			}
			s.queues[a.Name] = readQueues(sys, a.Name, full)
			if a.NetNsID >= 0 {
				wantIDs[a.NetNsID] = true
			}
		}
		if full {
			inst, nerr := napi.List("", 0)
			s.napiInst = inst
			s.napi, s.napiErr = napiThreadsOf(inst, nerr)
		}
		s.readPath(sys, full)
		s.localPorts = readLocalPorts()
		s.resolveIDs(cat, wantIDs)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading netns %s: %w", label(ns), err)
	}
	return s, nil
}

// resolveIDs maps the namespace ids this namespace uses for its peers to
// names: the catalog's named namespaces, the root one (""), then any
// process's namespace ("pid:N@C"). Runs inside the namespace: ids are local
// to the namespace that assigned them.
func (s *nsScan) resolveIDs(cat *catalog, want map[int]bool) {
	if len(want) == 0 {
		return
	}
	// match is the id this namespace gives the one fd refers to, if it is
	// one of the wanted ones and not named yet.
	match := func(fd uintptr) (int, bool) {
		id, err := netlink.GetNetNsIdByFd(int(fd))
		if err != nil || id < 0 || !want[id] {
			return 0, false
		}
		_, done := s.nsids[id]
		return id, !done
	}
	try := func(name string, fd uintptr) {
		if id, ok := match(fd); ok {
			s.nsids[id] = name
		}
	}
	try("", cat.root.Fd())
	for _, n := range cat.named {
		try(n.name, n.f.Fd())
	}
	if len(s.nsids) == len(want) {
		return
	}
	seen := map[uint64]bool{}
	for _, n := range cat.named {
		seen[n.ino] = true
	}
	// A namespace is named after its lowest PID, normally the
	// container's first process: a label must stay the same while the
	// container lives (lanes journals knobs under it), and a process
	// exec'd into the container later usually has a higher PID (not once
	// PIDs wrap, nor after the first process exited: such a label changes,
	// a limit docs/containers.md states). /proc lists in text order, where
	// "100000" comes before "10234".
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	for _, pid := range pids {
		p := "/proc/" + strconv.Itoa(pid) + "/ns/net"
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if id, ok := match(f.Fd()); ok {
			// A process's namespace goes by "pid:N@C", with its cookie
			// (netnsx.Pin), so journaled knobs are never restored
			// into another namespace that got the PID; read through
			// the same open file that matched, since the process may
			// have switched namespaces since. Unreadable: unresolved.
			if name, err := netnsx.PinHandle(pid, netns.NsHandle(f.Fd())); err == nil {
				s.nsids[id] = name
			}
		}
		f.Close()
		if len(s.nsids) == len(want) {
			return
		}
	}
}

func (s *nsScan) nsName(id int) string {
	if n, ok := s.nsids[id]; ok {
		return n
	}
	return "unknown"
}

func (s *nsScan) device(l netlink.Link) Device {
	a := l.Attrs()
	d := Device{
		Name:           a.Name,
		NetNS:          s.ns,
		Index:          a.Index,
		Type:           l.Type(),
		Up:             a.Flags&net.FlagUp != 0,
		MTU:            a.MTU,
		RxQueues:       s.queues[a.Name],
		Threaded:       s.threaded[a.Name],
		MAC:            a.HardwareAddr.String(),
		TxQueues:       s.path.txq[a.Name],
		MaxRxQueues:    s.path.maxq[a.Name][0],
		MaxTxQueues:    s.path.maxq[a.Name][1],
		XPS:            s.path.xps[a.Name],
		GRO:            s.path.gro[a.Name],
		UDPGRO:         s.path.udpGRO[a.Name].on,
		FeaturesUnread: s.path.udpGRO[a.Name].unread,
		XDPTarget:      s.path.xdpTarget[a.Index],
		Hooks:          s.path.hooks[a.Index],
	}
	if d.RxQueues == nil {
		d.RxQueues = []RxQueue{}
	}
	return d
}

// readQueues reads dev's receive queues from sys, its namespace's sysfs:
// their RPS settings where settings, their indexes alone otherwise.
func readQueues(sys, dev string, settings bool) []RxQueue {
	dir := sys + "/class/net/" + dev + "/queues"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var qs []RxQueue
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "rx-")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		q := RxQueue{Index: i, RPS: []int{}}
		if !settings {
			qs = append(qs, q)
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, e.Name(), "rps_cpus")); err == nil {
			q.RPSCPUs = strings.TrimSpace(string(b))
			if cpus, err := cpuset.ParseMask(q.RPSCPUs); err == nil && cpus != nil {
				q.RPS = cpus
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, e.Name(), "rps_flow_cnt")); err == nil {
			q.RPSFlowCnt, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		qs = append(qs, q)
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i].Index < qs[j].Index })
	return qs
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// napiThreadsOf returns, per ifindex, the pids of the threads polling
// the device's NAPI instances (nil for a device whose instances are not
// threaded), from a napi.List of the namespace being scanned (with the
// empty name it runs on the calling thread, which is in that namespace).
func napiThreadsOf(inst []napi.Instance, err error) (map[int][]int, error) {
	if err != nil {
		return nil, err
	}
	out := map[int][]int{}
	for _, in := range inst {
		if in.PID > 0 {
			out[in.IfIndex] = append(out[in.IfIndex], in.PID)
		} else if _, ok := out[in.IfIndex]; !ok {
			out[in.IfIndex] = nil
		}
	}
	return out, nil
}

func itoa(i int) string { return strconv.Itoa(i) }

// readLocalPorts is the calling thread's namespace's ip_local_port_range
// (zero if unreadable).
func readLocalPorts() [2]int {
	var r [2]int
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return r
	}
	if _, err := fmt.Sscan(string(b), &r[0], &r[1]); err != nil || r[0] >= r[1] {
		return [2]int{}
	}
	return r
}
