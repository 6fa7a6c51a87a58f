package cpuload

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/napi"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/topology/topotest"
)

// nicPollBed is a two-host testbed whose receiving underlay's NAPI
// instances (ids) a fresh SchedSampler may watch, and send, which sends n
// datagrams across it.
func nicPollBed(t *testing.T) (s *SchedSampler, ids []uint32, send func(n int)) {
	t.Helper()
	f := topotest.New(t, topotest.Options{Containers: 1})
	rx := f.Hosts[1]
	var idx int
	if err := nsx.Do(rx.NetNS, func() error {
		l, err := netlink.LinkByName(rx.Underlay)
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	inst, err := napi.List(rx.NetNS, idx)
	if err != nil || len(inst) == 0 {
		t.Skipf("no NAPI instances listed for %s: %v", rx.Underlay, err)
	}
	for _, in := range inst {
		ids = append(ids, in.ID)
	}
	// A veth hands frames to its peer's NAPI only from a sender without
	// TSO (as the testbed's underlay, a NIC-like wire).
	if err := ethtool.Set(f.Hosts[0].NetNS, f.Hosts[0].Underlay, ethtool.TSO, false); err != nil {
		t.Fatal(err)
	}
	s = newSchedSampler(t)
	send = func(n int) {
		t.Helper()
		if err := nsx.Do(f.Hosts[0].NetNS, func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: rx.UnderIP, Port: 9})
			if err != nil {
				return err
			}
			defer c.Close()
			for i := range n {
				if _, err := c.Write(fmt.Appendf(nil, "%08d", i)); err != nil {
					// Port unreachable coming back refuses a write now and
					// then; the frame before it was sent.
					continue
				}
				if i%64 == 63 {
					time.Sleep(time.Millisecond)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, ids, send
}

// TestNICPolls counts the receiving underlay's polls while datagrams
// cross it: every frame sent is polled (frames >= sent, within what else
// crosses the wire: ARP, the host's own), each counted poll found at
// least one frame, and a NAPI instance not watched counts nothing, not
// even one whose filter bit a watched id shares.
func TestNICPolls(t *testing.T) {
	s, ids, send := nicPollBed(t)
	total := func(sm Sample) (polls, frames uint64) {
		for _, c := range sm.Cores {
			polls += c.NIC.Polls
			frames += c.NIC.Frames
		}
		return
	}

	// Not watched: nothing counted.
	send(200)
	sm, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if p, fr := total(sm); sm.NICWatched || p != 0 || fr != 0 {
		t.Fatalf("unwatched: watched %v, %d polls, %d frames", sm.NICWatched, p, fr)
	}

	if err := s.WatchNAPIs(ids); err != nil {
		t.Fatal(err)
	}
	if sm, err = s.Sample(); err != nil {
		t.Fatal(err)
	}
	if sm.NICWatched {
		t.Fatal("the sample that spans WatchNAPIs claims to be watched")
	}
	const n = 2000
	sent := 0
	for try := 0; try < 3; try++ {
		send(n)
		sent += n
		if sm, err = s.Sample(); err != nil {
			t.Fatal(err)
		}
		polls, frames := total(sm)
		t.Logf("NAPI %v: %d polls, %d frames (%d datagrams sent)", ids, polls, frames, n)
		if !sm.NICWatched {
			t.Fatal("sample after WatchNAPIs not watched")
		}
		if polls == 0 || frames < polls {
			t.Fatalf("%d polls, %d frames", polls, frames)
		}
		// Every datagram crosses the watched device's NAPI; a few frames
		// more (ARP, ICMP) may too, and a datagram the sender dropped
		// never left.
		if frames >= n*95/100 && frames <= n+64 {
			break
		}
		if try == 2 {
			t.Fatalf("%d frames polled for %d datagrams sent", frames, n)
		}
	}
	for _, c := range sm.Cores {
		if fpp := c.NIC.FramesPerPoll(); c.NIC.Polls > 0 && (fpp < 1 || fpp > 64) {
			t.Errorf("cpu%d: %.2f frames per poll", c.CPU, fpp)
		}
	}

	// Watching watch (a sample spans the change), 200 datagrams count
	// nothing; the sample after them says watched as watched says.
	countsNothing := func(name string, watch []uint32, watched bool) {
		t.Helper()
		if err := s.WatchNAPIs(watch); err != nil {
			t.Fatal(err)
		}
		if _, err = s.Sample(); err != nil {
			t.Fatal(err)
		}
		send(200)
		if sm, err = s.Sample(); err != nil {
			t.Fatal(err)
		}
		if p, fr := total(sm); sm.NICWatched != watched || p != 0 || fr != 0 {
			t.Fatalf("%s: watched %v, %d polls, %d frames", name, sm.NICWatched, p, fr)
		}
	}
	// Unwatched again: the counting stops.
	countsNothing("unwatched again", nil, false)
	// Ids no NAPI instance has that share the real ones' bits in the
	// filter (nic_napi_bits): the lookup behind it turns the real ones away.
	var alias []uint32
	for _, id := range ids {
		// 1<<31 is a whole number of 64-bit words times the map's
		// entries, a power of two.
		alias = append(alias, id+1<<31)
	}
	countsNothing(fmt.Sprintf("watching %v, which share %v's filter bits", alias, ids), alias, true)
}

// TestNICWake: armed, the poll counter sends a wake for a window of the
// NIC's polls that found the armed depth; none for a depth its polls
// never reach, a window with fewer polls than armed, another core's
// polls, or once disarmed; arming needs the NIC watched and sane values.
func TestNICWake(t *testing.T) {
	s, ids, send := nicPollBed(t)
	if err := s.ArmWake(-1, 1, time.Millisecond, 1); err == nil {
		t.Fatal("armed without a NIC watched")
	}
	if s.Wakes() != nil {
		t.Fatal("wakes before the first arming")
	}
	if err := s.WatchNAPIs(ids); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		core, polls   int
		depth, window float64
	}{{-2, 1, 1, 1}, {-1, 0, 1, 1}, {-1, 1, 0, 1}, {-1, 1, 1, 0}} {
		if err := s.ArmWake(bad.core, bad.depth, time.Duration(bad.window*float64(time.Millisecond)), bad.polls); err == nil {
			t.Errorf("armed with %+v", bad)
		}
	}
	woken := func(what string, want bool) {
		t.Helper()
		select {
		case w := <-s.Wakes():
			if !want {
				t.Errorf("%s: woken by %+v", what, w)
			} else if w.Polls == 0 || w.Frames < w.Polls || w.CPU < 0 {
				t.Errorf("%s: wake %+v", what, w)
			}
		case <-time.After(500 * time.Millisecond):
			if want {
				t.Errorf("%s: no wake", what)
			}
		}
	}
	// Every poll finds a frame at least: a depth of one wakes at the
	// first counted poll after the first window's end.
	if err := s.ArmWake(-1, 1, time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	send(500)
	woken("armed at a depth every poll reaches", true)
	// No poll takes more than its budget (64).
	if err := s.ArmWake(-1, 100, time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	send(500)
	woken("armed at a depth no poll reaches", false)
	if err := s.ArmWake(-1, 1, time.Millisecond, 1<<30); err != nil {
		t.Fatal(err)
	}
	send(500)
	woken("armed for more polls a window than come", false)
	if err := s.ArmWake(4095, 1, time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	send(500)
	woken("armed for a core that polls nothing", false)
	if err := s.ArmWake(-1, 1, time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.DisarmWake(); err != nil {
		t.Fatal(err)
	}
	send(500)
	woken("disarmed", false)
}
