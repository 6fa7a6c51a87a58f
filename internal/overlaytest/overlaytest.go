// Package overlaytest moves real traffic between network namespaces for
// tests and checks what arrived: the testbed's and every mode's tests use
// it to prove the overlay still carries TCP and UDP.
package overlaytest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/pinned"
)

// listenTCP listens on dst (any port) in ns.
func listenTCP(t testing.TB, ns string, dst netip.Addr) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := nsx.Do(ns, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(dst, 0).String())
		return
	}); err != nil {
		t.Fatal(err)
	}
	return ln
}

// dialTCP connects from ns to ln.
func dialTCP(t testing.TB, ns string, ln net.Listener) net.Conn {
	t.Helper()
	var conn net.Conn
	if err := nsx.Do(ns, func() (err error) {
		conn, err = net.DialTimeout("tcp4", ln.Addr().String(), 10*time.Second)
		return
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", ln.Addr(), ns, err)
	}
	return conn
}

// TCP sends n bytes from a socket in srcNS to a listener on dst in dstNS
// and fails t unless exactly those bytes arrived.
func TCP(t testing.TB, srcNS, dstNS string, dst netip.Addr, n int) {
	t.Helper()
	ln := listenTCP(t, dstNS, dst)
	defer ln.Close()
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i*7 + i>>8 + i>>16)
	}
	want := sha256.Sum256(payload)
	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		h := sha256.New()
		n, err := io.Copy(h, c)
		var s [32]byte
		copy(s[:], h.Sum(nil))
		got <- result{s, n, err}
	}()
	conn := dialTCP(t, srcNS, ln)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(conn, bytes.NewReader(payload)); err != nil {
		conn.Close()
		t.Fatalf("TCP %s -> %s: %v", srcNS, dstNS, err)
	}
	conn.Close()
	r := <-got
	if r.err != nil || r.n != int64(n) || r.sum != want {
		t.Fatalf("TCP %s -> %s: received %d of %d bytes (err %v), equal content %v", srcNS, dstNS, r.n, n, r.err, r.sum == want)
	}
}

// UDPCount is how many datagrams UDP sends.
const UDPCount = 50

// UDP sends UDPCount datagrams of size bytes from srcNS to dst in dstNS,
// fails t if one arrives corrupt, and returns how many arrived; callers
// decide how many must.
func UDP(t testing.TB, srcNS, dstNS string, dst netip.Addr, size int) int {
	t.Helper()
	// A large buffer: with the receive path on another core than the
	// reader, a burst of 50 can overflow the default one (seen with rps).
	rc, sc := UDPPair(t, srcNS, dstNS, dst, streamRcvBuf)
	defer rc.Close()
	defer sc.Close()
	for i := 0; i < UDPCount; i++ {
		if _, err := sc.Write(bytes.Repeat([]byte{byte(i)}, size)); err != nil {
			t.Fatalf("UDP %s -> %s: %v", srcNS, dstNS, err)
		}
	}
	buf := make([]byte, 65536)
	got := 0
	for got < UDPCount {
		rc.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := rc.Read(buf)
		if err != nil {
			break
		}
		if n != size || !bytes.Equal(buf[:n], bytes.Repeat(buf[:1], size)) {
			t.Fatalf("UDP %s -> %s: corrupt datagram of %d bytes", srcNS, dstNS, n)
		}
		got++
	}
	return got
}

// Warm sends a few datagrams from srcNS to dst so every neighbour entry on
// the way is resolved before a test's measured stream: on a cold entry the
// sender holds the first datagrams until the ARP reply, and one sent while
// that queue is flushed from another core can overtake them, before any
// receive path sees a frame (seen as "datagrams 0-40 after 44" in about 1
// run of a veth-queues test in 10 to 20).
func Warm(t testing.TB, srcNS, dstNS string, dst netip.Addr) {
	t.Helper()
	UDPMost(t, srcNS, dstNS, dst, 50)
}

// UDPMost is UDP for modes that must not lose traffic: it fails t unless
// at least 9 in 10 datagrams arrived, and returns how many did.
func UDPMost(t testing.TB, srcNS, dstNS string, dst netip.Addr, size int) int {
	t.Helper()
	got := UDP(t, srcNS, dstNS, dst, size)
	if got < UDPCount*9/10 {
		t.Fatalf("UDP %s -> %s: %d of %d datagrams arrived", srcNS, dstNS, got, UDPCount)
	}
	return got
}

// UDPPair opens a UDP socket bound to dst (any port) in dstNS and one in
// srcNS connected to it; rcvBuf > 0 sets the receiver's buffer past
// rmem_max (SO_RCVBUFFORCE). The caller closes both.
func UDPPair(t testing.TB, srcNS, dstNS string, dst netip.Addr, rcvBuf int) (rc, sc *net.UDPConn) {
	t.Helper()
	if err := nsx.Do(dstNS, func() (err error) {
		rc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0)))
		if err != nil || rcvBuf <= 0 {
			return err
		}
		raw, err := rc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf)
		}); err != nil {
			return err
		}
		return serr
	}); err != nil {
		if rc != nil {
			rc.Close()
		}
		t.Fatal(err)
	}
	if err := nsx.Do(srcNS, func() (err error) {
		sc, err = net.DialUDP("udp4", nil, rc.LocalAddr().(*net.UDPAddr))
		return
	}); err != nil {
		rc.Close()
		t.Fatal(err)
	}
	return rc, sc
}

// Stream is a sequence-numbered UDP stream from a sender thread pinned to
// one core: what order-keeping modes are tested with.
type Stream struct {
	Count, Size, Burst int
	Pause              time.Duration
	CPU                int // core of the sending thread
	// During runs while the stream is sent (optional).
	During func()
}

type StreamResult struct {
	Sent, SendErrs, Received int
	// Reordered counts arrivals whose sequence number is not above every
	// one that arrived before.
	Reordered int
	Examples  []string
	// IncomingCPU is SO_INCOMING_CPU of the receiving socket at the end:
	// the core that ran UDP receive (the container stage) for the last
	// datagram.
	IncomingCPU int
	Src, Dst    netip.AddrPort
}

// streamRcvBuf is the receiving socket's buffer: large, so that what the
// receiver drops is not mistaken for what a mode loses.
const streamRcvBuf = 8 << 20

// Run sends the stream from a socket in srcNS to a socket bound to dst in
// dstNS and accounts the arrivals.
func (s Stream) Run(t testing.TB, srcNS, dstNS string, dst netip.Addr) StreamResult {
	t.Helper()
	if s.Size < 8 {
		s.Size = 8
	}
	if s.Burst == 0 {
		s.Burst = s.Count
	}
	rc, sc := UDPPair(t, srcNS, dstNS, dst, streamRcvBuf)
	defer rc.Close()
	defer sc.Close()
	res := StreamResult{
		Src: sc.LocalAddr().(*net.UDPAddr).AddrPort(),
		Dst: rc.LocalAddr().(*net.UDPAddr).AddrPort(),
	}
	res.Src = netip.AddrPortFrom(res.Src.Addr().Unmap(), res.Src.Port())
	res.Dst = netip.AddrPortFrom(res.Dst.Addr().Unmap(), res.Dst.Port())
	// Connect the receiver to the sender: UDP updates SO_INCOMING_CPU
	// for connected sockets only.
	raw, err := rc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Addr: res.Src.Addr().As4(), Port: int(res.Src.Port())})
	}); err != nil || cerr != nil {
		t.Fatalf("connecting the receiver to %v: %v %v", res.Src, err, cerr)
	}

	var sendDone atomic.Bool
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf := make([]byte, 65536)
		var highest uint64
		first := true
		for {
			rc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := rc.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && !sendDone.Load() {
					continue
				}
				return
			}
			if n < 8 {
				continue
			}
			seq := binary.BigEndian.Uint64(buf)
			res.Received++
			if !first && seq <= highest {
				res.Reordered++
				if len(res.Examples) < 5 {
					res.Examples = append(res.Examples, fmt.Sprintf("%d after %d", seq, highest))
				}
			} else {
				highest = seq
			}
			first = false
		}
	}()

	sendErr := make(chan error, 1)
	go func() {
		if err := pinned.Here(s.CPU); err != nil {
			sendErr <- err
			return
		}
		msg := make([]byte, s.Size)
		for i := 0; i < s.Count; i++ {
			binary.BigEndian.PutUint64(msg, uint64(i))
			if _, err := sc.Write(msg); err != nil {
				res.SendErrs++
			}
			res.Sent++
			if (i+1)%s.Burst == 0 && s.Pause > 0 {
				time.Sleep(s.Pause)
			}
		}
		sendErr <- nil
	}()
	if s.During != nil {
		s.During()
	}
	err = <-sendErr
	sendDone.Store(true)
	<-recvDone
	if err != nil {
		t.Fatal(err)
	}
	var gerr error
	raw.Control(func(fd uintptr) {
		res.IncomingCPU, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_INCOMING_CPU)
	})
	if gerr != nil {
		t.Fatalf("SO_INCOMING_CPU: %v", gerr)
	}
	return res
}

// Delivered runs s and fails t unless nine in ten of its datagrams
// arrive, and, when ordered is set, unless every try arrives in order.
// A burst lost to the machine's load (a vCPU stalled for a few
// milliseconds overflows a 256-frame veth ring or a backlog) is told
// apart from a datapath that loses frames by sending again at a fifth of
// the rate, twice at most: a loss that stays at a gentle rate is the
// datapath's. Order is judged on every try, as no load excuses
// reordering. The result is the last try's. Only for streams that can be
// sent again: s.During runs on every try.
func (s Stream) Delivered(t testing.TB, what string, ordered bool, srcNS, dstNS string, dst netip.Addr) StreamResult {
	t.Helper()
	for try := 0; ; try++ {
		r := s.Run(t, srcNS, dstNS, dst)
		if !r.short() || try == 2 {
			if ordered {
				InOrder(t, what, r)
			} else {
				Arrived(t, what, r)
			}
			return r
		}
		t.Logf("%s: %d of %d datagrams arrived, %d out of order; again at a fifth of the rate", what, r.Received, r.Sent, r.Reordered)
		if ordered && r.Reordered != 0 {
			t.Errorf("%s: %d datagrams arrived out of order %v", what, r.Reordered, r.Examples)
		}
		if s.Burst == 0 || s.Burst > s.Count {
			s.Burst = s.Count
		}
		if s.Pause == 0 {
			s.Pause = time.Millisecond
		}
		s.Burst = max(1, s.Burst/5)
	}
}

// short: fewer than nine in ten of r's datagrams arrived.
func (r StreamResult) short() bool { return r.Received*10 < r.Sent*9 }

// Arrived logs r and fails t if fewer than 90% of its datagrams arrived.
func Arrived(t testing.TB, what string, r StreamResult) {
	t.Helper()
	t.Logf("%s: sent %d (%d send errors), received %d, reordered %d %v", what, r.Sent, r.SendErrs, r.Received, r.Reordered, r.Examples)
	if r.short() {
		t.Errorf("%s: only %d of %d datagrams arrived", what, r.Received, r.Sent)
	}
}

// InOrder fails t if any datagram of r arrived out of order or fewer than
// 90% arrived.
func InOrder(t testing.TB, what string, r StreamResult) {
	t.Helper()
	Arrived(t, what, r)
	if r.Reordered != 0 {
		t.Errorf("%s: %d datagrams arrived out of order", what, r.Reordered)
	}
}

// TCPStream sends a paced TCP stream (Rate bits/s for Duration, written in
// 64 KiB chunks) from srcNS to a listener on dst in dstNS.
type TCPStream struct {
	Rate     int64
	Duration time.Duration
	// Pin sends from a thread pinned to core CPU. A stream whose order
	// is the question wants it on the core where the sending host
	// processes the stream's ACKs (its underlay NIC's poll core): TCP
	// sends from the writing thread and from the ACK's softirq, each
	// frame queued on the backlog of the core it was sent from (veth),
	// so a writer on another core races the ACK-clocked frames out of
	// order before they leave the sending host.
	Pin bool
	CPU int
}

// TCPResult is what a TCPStream's two ends saw (TCP_INFO at the end).
type TCPResult struct {
	Bytes int64
	// Retrans is the sender's retransmitted segments; ReordSeen its
	// reordering events (tcpi_reord_seen); OutOfOrder the receiver's
	// out-of-order packets (tcpi_rcv_ooopack).
	Retrans, ReordSeen, OutOfOrder uint32
}

// Run sends the stream and returns both ends' counters.
func (s TCPStream) Run(t testing.TB, srcNS, dstNS string, dst netip.Addr) TCPResult {
	t.Helper()
	ln := listenTCP(t, dstNS, dst)
	defer ln.Close()
	type recv struct {
		n    int64
		info *unix.TCPInfo
		err  error
	}
	got := make(chan recv, 1)
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- recv{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(s.Duration + 20*time.Second))
		n, err := io.Copy(io.Discard, c)
		info, ierr := tcpInfo(c)
		if err == nil {
			err = ierr
		}
		got <- recv{n, info, err}
		<-done
	}()
	defer close(done)
	conn := dialTCP(t, srcNS, ln)
	conn.SetDeadline(time.Now().Add(s.Duration + 20*time.Second))
	type sendResult struct {
		sent int64
		err  error
	}
	sending := make(chan sendResult, 1)
	go func() {
		if s.Pin {
			if err := pinned.Here(s.CPU); err != nil {
				sending <- sendResult{err: err}
				return
			}
		}
		chunk := make([]byte, 64<<10)
		start := time.Now()
		var sent int64
		for time.Since(start) < s.Duration {
			if _, err := conn.Write(chunk); err != nil {
				sending <- sendResult{sent, err}
				return
			}
			sent += int64(len(chunk))
			// Pace: sleep until the bytes sent so far are due.
			if due := time.Duration(float64(sent*8) / float64(s.Rate) * float64(time.Second)); due > time.Since(start) {
				time.Sleep(due - time.Since(start))
			}
		}
		sending <- sendResult{sent, nil}
	}()
	sr := <-sending
	if sr.err != nil {
		conn.Close()
		t.Fatalf("TCP %s -> %s: %v", srcNS, dstNS, sr.err)
	}
	sent := sr.sent
	sinfo, err := tcpInfo(conn)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.n != sent {
		t.Fatalf("TCP %s -> %s: received %d of %d bytes (%v)", srcNS, dstNS, r.n, sent, r.err)
	}
	return TCPResult{Bytes: r.n, Retrans: sinfo.Total_retrans, ReordSeen: sinfo.Reord_seen, OutOfOrder: r.info.Rcv_ooopack}
}

func tcpInfo(c net.Conn) (*unix.TCPInfo, error) {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return nil, err
	}
	return info, gerr
}
