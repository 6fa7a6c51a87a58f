//go:build linux

package reorder

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/pinned"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology/topotest"
)

// requireQdisc skips t unless it runs as root on a kernel with the BPF
// qdisc (a guest of scripts/vm; this host has none), saying why.
func requireQdisc(t *testing.T) {
	t.Helper()
	testenv.Root(t)
	if err := Supported(); err != nil {
		t.Skip(err)
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs two cores: micro-flows come from two")
	}
}

// pair is a sender namespace and a receiver namespace joined by a veth
// (a0 in A, b0 in B): the sender's a0 stands for a container's host-side
// veth, whose root qdisc the reassembler is.
type pair struct {
	A, B   string
	Dev    string // a0
	DstIP  netip.Addr
	DstMAC net.HardwareAddr
}

var (
	pairSrc = netip.MustParseAddr("198.18.250.1")
	pairDst = netip.MustParseAddr("198.18.250.2")
)

func newPair(t *testing.T) *pair {
	t.Helper()
	p := topotest.NewPrefix()
	pr := &pair{A: topotest.Namespace(t, p+"-a"), B: topotest.Namespace(t, p+"-b"), Dev: "a0", DstIP: pairDst}
	if err := nsx.Do(pr.A, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a0"}, PeerName: "b0"})
	}); err != nil {
		t.Fatal(err)
	}
	if err := nsx.Do(pr.A, func() error {
		b, err := netlink.LinkByName("b0")
		if err != nil {
			return err
		}
		f, err := nsFile(pr.B)
		if err != nil {
			return err
		}
		defer unix.Close(f)
		return netlink.LinkSetNsFd(b, f)
	}); err != nil {
		t.Fatal(err)
	}
	up := func(ns, dev string, addr netip.Addr) (net.HardwareAddr, error) {
		var mac net.HardwareAddr
		err := nsx.Do(ns, func() error {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				netlink.LinkSetUp(lo)
			}
			mac = l.Attrs().HardwareAddr
			return nil
		})
		return mac, err
	}
	var err error
	if _, err = up(pr.A, "a0", pairSrc); err != nil {
		t.Fatal(err)
	}
	if pr.DstMAC, err = up(pr.B, "b0", pairDst); err != nil {
		t.Fatal(err)
	}
	// b0's frames go to one core's backlog, as the plan sets a
	// container's veth behind the reassembler: whichever core dequeues
	// the qdisc hands them to its own backlog otherwise, and two
	// backlogs race to the socket (seen: 2 of 256 frames out of order
	// in TestPermutation with b0's RPS off).
	if err := knobs.Sysfs(pr.B, "/sys/class/net/b0/queues/rx-0/rps_cpus").Write([]byte("1")); err != nil {
		t.Fatal(err)
	}
	// A static neighbour: the first datagrams must not wait in ARP's
	// queue, which would let later ones pass them.
	if err := nsx.Do(pr.A, func() error {
		l, err := netlink.LinkByName("a0")
		if err != nil {
			return err
		}
		return netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: pairDst.AsSlice(), HardwareAddr: pr.DstMAC})
	}); err != nil {
		t.Fatal(err)
	}
	return pr
}

func nsFile(ns string) (int, error) {
	return unix.Open(nsx.Path(ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// withQdisc loads a reassembler for cfg and makes it a0's root qdisc; both
// go when the test ends.
func (pr *pair) withQdisc(t *testing.T, cfg Config) *Loaded {
	t.Helper()
	kind := Kind(pr.A, pr.Dev)
	l, err := Load(kind, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := DetachRoot(pr.A, pr.Dev, kind); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		l.Close()
	})
	if err := AttachRoot(pr.A, pr.Dev, kind); err != nil {
		t.Fatal(err)
	}
	r, err := RootQdisc(pr.A, pr.Dev)
	if err != nil || r.Kind != kind {
		t.Fatalf("root qdisc of a0: %v (%v), want %s", r, err, kind)
	}
	return l
}

// microflow is one micro-flow of a test flow: frames [First, First+N) of
// the flow, tagged with sequence number Seq, sent by the core Core.
type microflow struct {
	Seq   uint32
	First int
	N     int
	Core  int
}

// flowOf cuts frames 0..n*batch-1 into n micro-flows of batch frames, over
// two cores round robin (micro-flow k on core k%2), as the splitter does.
func flowOf(n, batch int) []microflow {
	out := make([]microflow, n)
	for k := range out {
		out[k] = microflow{Seq: uint32(k), First: k * batch, N: batch, Core: k % 2}
	}
	return out
}

// sender sends micro-flows from one UDP socket per core (each on a thread
// pinned to its core, so the qdisc's enqueue runs there), every frame
// tagged with its micro-flow's sequence number in skb->priority (the
// socket's SO_PRIORITY) and carrying its frame number in its first 8 bytes.
type sender struct {
	t     *testing.T
	steps [2]chan func(*net.UDPConn)
	done  chan error
	wg    sync.WaitGroup
}

const testFlow = 0x2a5 // the flow bits of the test flow's tag

func newSender(t *testing.T, pr *pair, port int) *sender {
	t.Helper()
	s := &sender{t: t, done: make(chan error, 2)}
	for core := range 2 {
		s.steps[core] = make(chan func(*net.UDPConn))
		ready := make(chan error, 1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			// The thread stays pinned and in A until the goroutine
			// ends (pinned.Here).
			if err := pinned.Here(core); err != nil {
				ready <- err
				return
			}
			var c *net.UDPConn
			err := nsx.Do(pr.A, func() (err error) {
				c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(pr.DstIP, uint16(port))))
				return err
			})
			ready <- err
			if err != nil {
				return
			}
			defer c.Close()
			for step := range s.steps[core] {
				step(c)
				s.done <- nil
			}
		}()
		if err := <-ready; err != nil {
			t.Fatalf("sender on core %d: %v", core, err)
		}
	}
	t.Cleanup(s.close)
	return s
}

func (s *sender) close() {
	for _, c := range s.steps {
		if c != nil {
			close(c)
		}
	}
	for i := range s.steps {
		s.steps[i] = nil
	}
	s.wg.Wait()
}

// send sends mf's frames, except those skip says, from its core, and
// returns once they are sent.
func (s *sender) send(mf microflow, skip func(frame int) bool) {
	s.t.Helper()
	s.steps[mf.Core] <- func(c *net.UDPConn) { sendFrames(c, mf, skip) }
	<-s.done
}

// sendTogether sends the micro-flows of each core at once, each core's in
// its order: the cores race.
func (s *sender) sendTogether(per [2][]microflow) {
	s.t.Helper()
	for core := range 2 {
		mfs := per[core]
		s.steps[core] <- func(c *net.UDPConn) {
			for _, mf := range mfs {
				sendFrames(c, mf, nil)
			}
		}
	}
	<-s.done
	<-s.done
}

func sendFrames(c *net.UDPConn, mf microflow, skip func(int) bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PRIORITY, int(Tag(testFlow, 0, mf.Seq)))
	})
	msg := make([]byte, 64)
	for i := range mf.N {
		f := mf.First + i
		if skip != nil && skip(f) {
			continue
		}
		binary.BigEndian.PutUint64(msg, uint64(f))
		c.Write(msg)
	}
}

// receiver reads the test flow's frames in B.
type receiver struct {
	c    *net.UDPConn
	Port int
}

func newReceiver(t *testing.T, pr *pair) *receiver {
	t.Helper()
	var c *net.UDPConn
	if err := nsx.Do(pr.B, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(pr.DstIP, 0)))
		if err != nil {
			return err
		}
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) })
		return serr
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &receiver{c: c, Port: c.LocalAddr().(*net.UDPAddr).Port}
}

// arrivals is what the receiver got: frame numbers in arrival order.
type arrivals []int

// read takes frames until want arrived or nothing came for quiet.
func (r *receiver) read(want int, quiet time.Duration) arrivals {
	var got arrivals
	buf := make([]byte, 2048)
	for len(got) < want {
		r.c.SetReadDeadline(time.Now().Add(quiet))
		n, err := r.c.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			break
		}
		if err != nil || n < 8 {
			break
		}
		got = append(got, int(binary.BigEndian.Uint64(buf)))
	}
	return got
}

// outOfOrder counts arrivals below one that came before, with examples.
func (a arrivals) outOfOrder() (n int, ex []string) {
	highest := -1
	for _, f := range a {
		if f < highest {
			n++
			if len(ex) < 4 {
				ex = append(ex, fmt.Sprintf("%d after %d", f, highest))
			}
			continue
		}
		highest = f
	}
	return n, ex
}
