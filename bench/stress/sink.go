package stress

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Sink receives the generator's datagrams in a container and checks their
// sequence numbers, per flow (inner UDP source port).
type Sink struct {
	NetNS  string         // namespace the socket lives in ("" = current)
	Addr   netip.AddrPort // address and port it binds
	CPUs   []int          // cores the reading thread is pinned to (nil = unpinned)
	RcvBuf int            // socket receive buffer in bytes; 0 = DefaultRcvBuf

	fd       int
	stop     atomic.Bool
	done     chan struct{}
	received atomic.Uint64 // live datagram count, for callers waiting for a drain
	stats    SinkStats
	err      error
	once     sync.Once
}

// DefaultRcvBuf is large enough to absorb a burst without letting the socket
// queue grow into a latency problem (SO_RCVBUFFORCE doubles it).
const DefaultRcvBuf = 16 << 20

// SinkStats is what a Sink received.
type SinkStats struct {
	Datagrams uint64 // all datagrams received
	Bytes     uint64 // their UDP payload bytes
	Short     uint64 // datagrams too short to carry a sequence number
	Flows     int    // distinct source ports seen
	// Reorder counts arrivals whose sequence number is below the highest
	// already seen in their flow.
	Reorder uint64
	// Lost counts, per flow, the sequence numbers between the first and the
	// highest seen that never arrived (duplicates would hide losses; the
	// generator never duplicates).
	Lost        uint64
	First, Last time.Time // arrival of the first and last datagram
	Err         error     // why reading stopped early, if it did
}

type flowState struct {
	first, highest uint64
	received       uint64
}

const (
	sinkBatch  = 64   // datagrams per recvmmsg
	sinkBufLen = 9216 // per datagram: a jumbo frame's worth; longer ones are counted, not copied in full
	// How long a blocked recvmmsg waits before looking at the stop flag.
	sinkPoll = 50 * time.Millisecond
)

// Start opens the socket inside NetNS (a socket stays in the namespace it
// was created in, whichever thread reads it later) and starts reading from
// a thread pinned to CPUs.
func (s *Sink) Start() error {
	if !s.Addr.Addr().Is4() {
		return fmt.Errorf("sink address %v: need IPv4", s.Addr)
	}
	rcvbuf := s.RcvBuf
	if rcvbuf == 0 {
		rcvbuf = DefaultRcvBuf
	}
	err := nsx.Do(s.NetNS, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
		if err != nil {
			return fmt.Errorf("sink socket: %w", err)
		}
		// FORCE: past net.core.rmem_max, which a namespace starts with at
		// its small default.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf); err != nil {
			unix.Close(fd)
			return fmt.Errorf("sink SO_RCVBUFFORCE %d: %w", rcvbuf, err)
		}
		tv := unix.NsecToTimeval(sinkPoll.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return fmt.Errorf("sink SO_RCVTIMEO: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: s.Addr.Addr().As4(), Port: int(s.Addr.Port())}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("binding sink to %v in netns %q: %w", s.Addr, s.NetNS, err)
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return err
	}
	s.done = make(chan struct{})
	started := make(chan error, 1)
	go s.read(started)
	if err := <-started; err != nil {
		<-s.done
		unix.Close(s.fd)
		return err
	}
	return nil
}

// Received is the number of datagrams read so far.
func (s *Sink) Received() uint64 { return s.received.Load() }

// Stop ends reading, closes the socket and returns the totals. Datagrams
// still queued in the socket when Stop is called are not read: wait for
// Received to settle first to count them.
func (s *Sink) Stop() SinkStats {
	s.once.Do(func() {
		s.stop.Store(true)
		<-s.done
		unix.Close(s.fd)
		s.stats.Err = s.err
	})
	return s.stats
}

func (s *Sink) read(started chan<- error) {
	defer close(s.done)
	// Pinning changes the thread for good: never unlock it, so the runtime
	// retires the thread with this goroutine.
	runtime.LockOSThread()
	if err := pinThread(s.CPUs...); err != nil {
		started <- err
		return
	}
	started <- nil

	bufs := make([]byte, sinkBatch*sinkBufLen)
	names := make([]unix.RawSockaddrInet4, sinkBatch)
	iovs := make([]unix.Iovec, sinkBatch)
	hdrs := make([]unix.Mmsghdr, sinkBatch)
	for i := range hdrs {
		iovs[i].Base = &bufs[i*sinkBufLen]
		iovs[i].SetLen(sinkBufLen)
		hdrs[i].Hdr.Iov = &iovs[i]
		hdrs[i].Hdr.SetIovlen(1)
		hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
	}
	acc := newSeqAccount(&s.stats)
	st := &s.stats
	for !s.stop.Load() {
		for i := range hdrs {
			hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		}
		// WAITFORONE: block (up to SO_RCVTIMEO) for the first datagram,
		// then take whatever else is queued. TRUNC: report a datagram's
		// real length even when the buffer is shorter.
		n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd),
			uintptr(unsafe.Pointer(&hdrs[0])), sinkBatch,
			unix.MSG_WAITFORONE|unix.MSG_TRUNC, 0, 0)
		if errno != 0 {
			if errno == unix.EAGAIN || errno == unix.EINTR {
				continue
			}
			s.err = fmt.Errorf("sink recvmmsg: %w", errno)
			break
		}
		now := time.Now()
		if st.Datagrams == 0 && n > 0 {
			st.First = now
		}
		for i := 0; i < int(n); i++ {
			port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&names[i].Port))[:])
			acc.add(port, bufs[i*sinkBufLen:(i+1)*sinkBufLen], int(hdrs[i].Len))
		}
		if n > 0 {
			st.Last = now
			s.received.Add(uint64(n))
		}
	}
	runtime.KeepAlive(iovs)
	runtime.KeepAlive(names)
	acc.finish()
}

// seqAccount keeps the per-flow sequence bookkeeping of a Sink.
type seqAccount struct {
	st    *SinkStats
	flows map[uint16]*flowState
}

func newSeqAccount(st *SinkStats) *seqAccount {
	return &seqAccount{st: st, flows: make(map[uint16]*flowState)}
}

// add counts one datagram of length bytes from source port port; buf holds
// (at least the start of) its payload.
func (a *seqAccount) add(port uint16, buf []byte, length int) {
	st := a.st
	st.Datagrams++
	st.Bytes += uint64(length)
	if length < seqLen {
		st.Short++
		return
	}
	seq := binary.BigEndian.Uint64(buf)
	f := a.flows[port]
	if f == nil {
		a.flows[port] = &flowState{first: seq, highest: seq, received: 1}
		return
	}
	f.received++
	if seq < f.highest {
		st.Reorder++
		f.first = min(f.first, seq)
		return
	}
	f.highest = seq
}

// finish fills in the totals that need every flow's final state.
func (a *seqAccount) finish() {
	a.st.Flows = len(a.flows)
	a.st.Lost = 0
	for _, f := range a.flows {
		if want := f.highest - f.first + 1; want > f.received {
			a.st.Lost += want - f.received
		}
	}
}
