// Package overlaytest moves real traffic between network namespaces for
// tests and checks what arrived: the testbed's and every mode's tests use
// it to prove the overlay still carries TCP and UDP.
package overlaytest

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// TCP sends n bytes from a socket in srcNS to a listener on dst in dstNS
// and fails t unless exactly those bytes arrived.
func TCP(t testing.TB, srcNS, dstNS string, dst netip.Addr, n int) {
	t.Helper()
	var ln net.Listener
	if err := nsx.Do(dstNS, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(dst, 0).String())
		return
	}); err != nil {
		t.Fatal(err)
	}
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
	var conn net.Conn
	if err := nsx.Do(srcNS, func() (err error) {
		conn, err = net.DialTimeout("tcp4", ln.Addr().String(), 10*time.Second)
		return
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", ln.Addr(), srcNS, err)
	}
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
	rc, sc := UDPPair(t, srcNS, dstNS, dst, 0)
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
