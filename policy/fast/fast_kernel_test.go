package fast_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/overlaytest"
	_ "github.com/lanesnet/lanes/policy/falcon" // falcon and falcon-prism, with x-fast=true
	"github.com/lanesnet/lanes/policy/fast"
	_ "github.com/lanesnet/lanes/policy/prism" // prism-batch, with x-fast=true
	"github.com/lanesnet/lanes/testbed"
)

// agentEnv, set to "NETNS STATEDIR", makes the test binary run the
// applied mode's agent until it is killed: an agent process the test can
// kill -9.
const agentEnv = "LANES_FAST_TEST_AGENT"

func TestMain(m *testing.M) {
	if v := os.Getenv(agentEnv); v != "" {
		ns, dir, _ := strings.Cut(v, " ")
		logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "agent: "+format+"\n", args...) }
		ag, _, err := control.NewAgent(control.AgentOptions{NetNS: ns, StateDir: dir, Logf: logf})
		if err == nil {
			err = ag.Run(context.Background())
		}
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	modetest.Main(m, "tf")
}

// startAgentProcess runs the applied mode's agent in a process of its own,
// killed (SIGKILL) by the returned function or when the test ends. The
// kernel kills it too should the test die: Pdeathsig follows the thread
// that started the child, so a goroutine holds that thread until the
// child is gone (a thread nsx.Do discards would kill it mid-test).
func startAgentProcess(t *testing.T, a *modetest.Applied) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), agentEnv+"="+a.NS+" "+a.StateDir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started, ended := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(ended)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGKILL)
			<-ended
		})
	}
	t.Cleanup(kill)
	return kill
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// dgram is what a container's socket got: the datagram's sequence number
// and payload, and the TTL and TOS of the IP packet that carried it.
type dgram struct {
	seq      uint64
	ttl, tos int
	payload  []byte
}

// vanillaFlow warms the way between src and dst both ways, snapshots tb's
// knobs (before) and sends n datagrams of a new UDP flow from src to dst
// through the kernel's path: what arrived is vanilla, every one of them.
func vanillaFlow(t *testing.T, tb *testbed.Testbed, src, dst testbed.Container, n int) (f *udpFlow, vanilla []dgram, before map[string]string) {
	t.Helper()
	overlaytest.Warm(t, dst.NetNS, src.NetNS, src.Addr.Addr())
	overlaytest.Warm(t, src.NetNS, dst.NetNS, dst.Addr.Addr())
	before = modetest.Snapshot(t, tb)
	f = newUDPFlow(t, src, dst)
	vanilla = f.send(t, n)
	if len(vanilla) != n {
		t.Fatalf("premise: vanilla delivered %d of %d datagrams", len(vanilla), n)
	}
	return f, vanilla, before
}

// udpFlow is one UDP flow between two containers, its receiver reading
// each packet's TTL and TOS.
type udpFlow struct {
	rc, sc *net.UDPConn
	next   uint64
}

func newUDPFlow(t *testing.T, src, dst testbed.Container) *udpFlow {
	t.Helper()
	rc, sc := overlaytest.UDPPair(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 8<<20)
	t.Cleanup(func() { rc.Close(); sc.Close() })
	raw, err := rc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		}
	})
	if serr != nil {
		t.Fatal(serr)
	}
	return &udpFlow{rc: rc, sc: sc}
}

// payload is datagram seq's bytes: its number, then a pattern of it.
func payload(seq uint64) []byte { return payloadOf(seq, 200) }

// payloadOf is datagram seq's n bytes (n >= 8): its number, then a
// pattern of it.
func payloadOf(seq uint64, n int) []byte {
	b := make([]byte, n)
	binary.BigEndian.PutUint64(b, seq)
	for i := 8; i < len(b); i++ {
		b[i] = byte(seq*31 + uint64(i))
	}
	return b
}

// send sends n datagrams (bursts of 25 a millisecond apart) and returns
// those of them that arrived, in their order; one that comes later than
// 300 ms after the last arrival counts as lost.
func (f *udpFlow) send(t *testing.T, n int) []dgram {
	t.Helper()
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = 200
	}
	return f.sendSizes(t, sizes)
}

// sendSizes is send with datagrams of these sizes, in this order.
func (f *udpFlow) sendSizes(t *testing.T, sizes []int) []dgram {
	t.Helper()
	from := f.next
	for i, n := range sizes {
		if _, err := f.sc.Write(payloadOf(f.next, n)); err != nil {
			t.Fatalf("sending: %v", err)
		}
		f.next++
		if (i+1)%25 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return f.receive(from)
}

// receive returns the datagrams numbered from on that arrive, in their
// order; one that comes later than 300 ms after the last arrival counts
// as lost.
func (f *udpFlow) receive(from uint64) []dgram {
	var got []dgram
	buf, oob := make([]byte, 65536), make([]byte, 256)
	for {
		f.rc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		m, on, _, _, err := f.rc.ReadMsgUDP(buf, oob)
		if err != nil {
			return got
		}
		if m < 8 {
			continue
		}
		d := dgram{seq: binary.BigEndian.Uint64(buf), ttl: -1, tos: -1, payload: bytes.Clone(buf[:m])}
		if d.seq < from || d.seq >= f.next {
			continue
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:on])
		for _, c := range msgs {
			if c.Header.Level == unix.IPPROTO_IP && len(c.Data) > 0 {
				switch c.Header.Type {
				case unix.IP_TTL:
					d.ttl = int(binary.NativeEndian.Uint32(c.Data))
				case unix.IP_TOS:
					d.tos = int(c.Data[0])
				}
			}
		}
		got = append(got, d)
	}
}

// same checks that got is every datagram of a stream of n, in order, each
// with its own payload and the TTL and TOS the kernel's path delivered
// (want, a stream the kernel's path carried).
func same(t *testing.T, what string, got, want []dgram, n int) {
	t.Helper()
	if len(got) != n || len(want) != n {
		t.Fatalf("%s: %d of %d datagrams (the kernel's path: %d)", what, len(got), n, len(want))
	}
	for i, d := range got {
		if i > 0 && d.seq != got[i-1].seq+1 {
			t.Fatalf("%s: datagram %d after %d", what, d.seq, got[i-1].seq)
		}
		if !bytes.Equal(d.payload, payload(d.seq)) || d.ttl != want[i].ttl || d.tos != want[i].tos {
			t.Fatalf("%s: datagram %d: TTL %d TOS %d, payload intact %v; the kernel's path: TTL %d TOS %d",
				what, d.seq, d.ttl, d.tos, bytes.Equal(d.payload, payload(d.seq)), want[i].ttl, want[i].tos)
		}
	}
}

// vxlanRx is how many packets the host's VXLAN device received.
func vxlanRx(t *testing.T, h *testbed.Host) uint64 { return vxlanStats(t, h).RxPackets }

// vxlanStats are the host's VXLAN device's statistics.
func vxlanStats(t *testing.T, h *testbed.Host) netlink.LinkStatistics {
	return overlaytest.LinkStats(t, h.NetNS, h.VXLAN)
}

// counters reads the fast path's counters (split stage).
func counters(t *testing.T, dp *steer.Datapath) steer.Counters {
	t.Helper()
	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st[steer.StageSplit]
}

// bulkIntact sends a TCP stream from src to dst (the sender's TSO makes
// GSO frames, which the fast path leaves to the kernel's path, with
// single segments between them it may take) and fails t unless every byte
// arrives intact. That no frame overtakes one of its flow on the kernel's
// path is TestFastKeepsOrder's: a TCP receiver here also queues segments
// out of order on the kernel's path alone (losses), so its count cannot
// decide it.
func bulkIntact(t *testing.T, dp *steer.Datapath, src, dst testbed.Container) {
	t.Helper()
	c0 := counters(t, dp)
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 16<<20)
	if c := counters(t, dp).Sub(c0); c.FastGSO == 0 {
		t.Fatalf("premise: the stream came as GSO frames to its entry (counters %+v)", c)
	}
}

// listFlush checks that lanes fast lists the flow to dst and flushes it
// (its next frames teach it again).
func listFlush(t *testing.T, ns, dst string) {
	t.Helper()
	ft, err := control.OpenFast(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer ft.Close()
	es, err := ft.List()
	if err != nil || len(es) == 0 || !strings.Contains(strings.Join(es, "\n"), " > "+dst+":") {
		t.Fatalf("lanes fast list: %q, %v: want the flow to %s", es, err, dst)
	}
	if n, err := ft.Flush(); err != nil || n < len(es) {
		t.Fatalf("lanes fast flush: %d entries, %v: want %d at least", n, err, len(es))
	}
	if es, err := ft.List(); err != nil || len(es) != 0 {
		t.Fatalf("lanes fast list after flush: %q, %v", es, err)
	}
}

// nftDrop adds to h's namespace an nftables rule dropping every VXLAN
// datagram from peer; del removes it (also when the test ends).
func nftDrop(t *testing.T, h, peer *testbed.Host) (del func()) {
	t.Helper()
	return nftRule(t, h, "input", fmt.Sprintf("ip saddr %s udp dport %d drop", peer.UnderlayAddr.Addr(), h.Port))
}

// nftRule adds to h's namespace an nftables chain on hook with rule; del
// removes it (also when the test ends).
func nftRule(t *testing.T, h *testbed.Host, hook, rule string) (del func()) {
	t.Helper()
	return nftRuleIn(t, h.NetNS, hook, rule)
}

// nftRuleIn adds to namespace ns an nftables chain on hook with rule; del
// removes it (also when the test ends).
func nftRuleIn(t *testing.T, ns, hook, rule string) (del func()) {
	t.Helper()
	script := fmt.Sprintf("table inet lanes_fast_fw {\n chain c {\n  type filter hook %s priority 0; policy accept;\n  %s\n }\n}\n", hook, rule)
	cmd := exec.Command("nsenter", "--net="+nsx.Path(ns), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f %q: %v: %s", script, err, out)
	}
	done := false
	del = func() {
		if !done {
			done = true
			if out, err := exec.Command("nsenter", "--net="+nsx.Path(ns), "nft", "delete", "table", "inet", "lanes_fast_fw").CombinedOutput(); err != nil {
				t.Errorf("deleting the nftables table: %v: %s", err, out)
			}
		}
	}
	t.Cleanup(del)
	return del
}

// tcpRR runs rounds of request and response (100 bytes each way) between
// a client in src and a server in dst, and fails t unless every response
// is the server's answer to its request.
func tcpRR(t *testing.T, src, dst testbed.Container, rounds int) {
	t.Helper()
	var ln net.Listener
	if err := nsx.Do(dst.NetNS, func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(dst.Addr.Addr().String(), "0"))
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 100)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			for i := range buf {
				buf[i] ^= 0xff
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := nsx.Do(src.NetNS, func() (err error) {
		c, err = net.DialTimeout("tcp4", ln.Addr().String(), 10*time.Second)
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	req, resp := make([]byte, 100), make([]byte, 100)
	for r := range rounds {
		for i := range req {
			req[i] = byte(r + i)
		}
		if _, err := c.Write(req); err != nil {
			t.Fatalf("request %d: %v", r, err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			t.Fatalf("response %d: %v", r, err)
		}
		for i := range resp {
			if resp[i] != req[i]^0xff {
				t.Fatalf("response %d is not the answer to its request", r)
			}
		}
	}
}

// On the docker layout (bridged) and the flannel layout (routed), a UDP
// flow between containers on the two hosts, once its first frames took
// the kernel's path, goes from the receiver's underlay straight into its
// container: every datagram is counted on the fast path, and the
// container gets every datagram, in order, with the payload, TTL and TOS
// the kernel's path delivered (the same flow through vanilla first). A
// TCP request-response exchange works. An nftables rule dropping the
// flow, added while it runs on the fast path, drops every datagram sent
// after the command returned, as vanilla does. With the agent killed
// (SIGKILL), nothing takes the fast path once its lease has passed, and
// the kernel's path delivers everything. Reset restores every knob.
func TestFastTestbed(t *testing.T) {
	for _, topo := range []testbed.Topology{testbed.Docker, testbed.Flannel, testbed.Calico} {
		t.Run(string(topo), func(t *testing.T) { testFast(t, modetest.UpTestbed(t, topo)) })
	}
}

// The same on the overlay flanneld builds, run as an operator runs it
// where the host's FORWARD policy accepts (--iptables-forward-rules=false,
// --ip-masq=false): flanneld then installs no iptables table, and the
// fast path runs from the underlay.
func TestFastFlanneld(t *testing.T) {
	if err := testbed.CheckOverlay(testbed.OverlayFlanneld); err != nil {
		t.Skipf("flanneld overlay: %v", err)
	}
	testFast(t, modetest.UpTestbedConfig(t, testbed.Config{Overlay: testbed.OverlayFlanneld, NoForwardRules: true}))
}

func testFast(t *testing.T, tb *testbed.Testbed) {
	const n = 200
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	f, vanilla, before := vanillaFlow(t, tb, src, dst, n)
	del := nftDrop(t, r, s)
	if got := f.send(t, n); len(got) != 0 {
		t.Fatalf("premise: vanilla delivered %d of %d datagrams past the rule", len(got), n)
	}
	del()

	a := modetest.Apply(t, tb, fast.Mode, map[string]string{"x-interval": "100ms"})
	dp := a.Open(t)
	kill := startAgentProcess(t, a)
	onFast := func() {
		t.Helper()
		waitVouched(t, dp, f, "the flow's entry", func() (int, error) { es, err := dp.Fast().Entries(); return len(es), err })
	}
	onFast()
	rx0, c0 := vxlanRx(t, r), counters(t, dp)
	got := f.send(t, n)
	same(t, "on the fast path", got, vanilla, n)
	c := counters(t, dp).Sub(c0)
	if rx := vxlanRx(t, r) - rx0; rx >= n || c.Fast < n {
		t.Errorf("%s received %d packets of %d datagrams, %d frames took the fast path (counters %+v): want the fast path to carry them", r.VXLAN, rx, n, c.Fast, c)
	}

	listFlush(t, a.NS, dst.Addr.Addr().String())
	bulkIntact(t, dp, src, dst)

	c0 = counters(t, dp)
	tcpRR(t, src, dst, 50)
	if c := counters(t, dp).Sub(c0); c.Fast == 0 {
		t.Errorf("no TCP segment took the fast path (counters %+v)", c)
	}

	del = nftDrop(t, r, s)
	if got := f.send(t, n); len(got) != 0 {
		t.Errorf("%d of %d datagrams sent after the rule was added were delivered (vanilla: 0)", len(got), n)
	}
	del()

	onFast()
	lapse(t, dp, kill)
	c0 = counters(t, dp)
	if got := f.send(t, n); len(got) != n {
		t.Errorf("with the agent killed: %d of %d datagrams delivered", len(got), n)
	}
	if c := counters(t, dp).Sub(c0); c.Fast != 0 || c.FastLease == 0 {
		t.Errorf("with the agent killed and its lease past: counters %+v, want nothing on the fast path", c)
	}
	a.ResetAndCheck(t, before)
}

// Beside Falcon or PRISM (x-fast=true), the fast path takes a flow's
// frames as they come out of the first stage's queue those handed them
// to: Falcon's split (split=true with spread=always: a split core by hash
// from the first frame), falcon-prism's classes (bulk queued on the IRQ
// core even while no flow is marked) or prism-batch's high-priority
// queue (the flow marked), where a marked flow then runs to completion
// in its own queue's kthread. Every datagram arrives, in order, as
// vanilla's, counted on the fast path, and the queue's count of the
// flow's frames in flight drains to zero, as the mode's own program would
// have counted them out (a move of the flow would otherwise wait for
// frames long delivered). TCP request-response works; reset restores
// every knob.
func TestFastBeside(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	for _, m := range []struct {
		mode   string
		params map[string]string
		mark   bool
	}{
		{"falcon", map[string]string{"x-fast": "true", "split": "true", "spread": "always"}, false},
		{"falcon-prism", map[string]string{"x-fast": "true", "x-bulk-inline": "false"}, false},
		{"prism-batch", map[string]string{"x-fast": "true", "high": "queue"}, true},
	} {
		t.Run(m.mode, func(t *testing.T) { testBeside(t, tb, m.mode, m.params, m.mark) })
	}
}

func testBeside(t *testing.T, tb *testbed.Testbed, mode string, params map[string]string, mark bool) {
	const n = 200
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	f, vanilla, before := vanillaFlow(t, tb, src, dst, n)
	port := uint16(f.rc.LocalAddr().(*net.UDPAddr).Port)

	a := modetest.Apply(t, tb, mode, params)
	dp := a.Open(t)
	if mark {
		if err := dp.Prio().AddRule(steer.Rule{Addr: dst.Addr.Addr(), Port: port, Proto: unix.IPPROTO_UDP}); err != nil {
			t.Fatal(err)
		}
	}
	startAgentProcess(t, a)
	waitVouched(t, dp, f, "the flow's entry", func() (int, error) { es, err := dp.Fast().Entries(); return len(es), err })
	c0 := counters(t, dp)
	got := f.send(t, n)
	same(t, "on the fast path beside "+mode, got, vanilla, n)
	c := counters(t, dp).Sub(c0)
	if c.Fast < n || c.Steered < n || mark && c.High < n {
		t.Errorf("counters %+v: want the first stage to queue every datagram (in the high-priority queue if marked) and the fast path to take each", c)
	}
	waitFor(t, "the first stage's count of the flow in flight to drain", func() bool {
		flows, err := dp.Flows()
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range flows {
			if fl.Stage == steer.StageSplit && fl.Dst == dst.Addr.Addr() && fl.DstPort == port {
				return fl.InFlight == 0
			}
		}
		t.Fatalf("the flow has no state at the first stage: %+v", flows)
		return false
	})

	c0 = counters(t, dp)
	tcpRR(t, src, dst, 50)
	if c := counters(t, dp).Sub(c0); c.Fast == 0 {
		t.Errorf("no TCP segment took the fast path (counters %+v)", c)
	}
	a.ResetAndCheck(t, before)
}

// On the overlay dockerd builds (the VXLAN device, bridge and veths in an
// overlay namespace, the underlay in the host's), the fast path starts at
// the VXLAN device: a UDP flow's datagrams, once its first took the
// kernel's path, are counted on it and skip the host-side veth's
// transmit, arriving every one, in order, as vanilla's; TCP bulk, whose
// GRO'd segments take it too, arrives intact; a FORWARD rule in the
// overlay namespace dropping the flow at the bridge (bridge-nf-call-
// iptables is on there), added while the flow runs on the fast path,
// drops every datagram sent after the command returned, as vanilla does.
// Reset restores every knob.
func TestFastDockerd(t *testing.T) {
	const n = 200
	tb := modetest.UpTestbedOverlay(t, "dockerd")
	r, s := tb.Receiver(), tb.Sender()
	src, dst := s.Containers[0], r.Containers[0]
	f, vanilla, before := vanillaFlow(t, tb, src, dst, n)
	dropFwd := fmt.Sprintf("ip daddr %s udp dport %d drop", dst.Addr.Addr(), f.rc.LocalAddr().(*net.UDPAddr).Port)
	del := nftRuleIn(t, r.OverlayNS(), "forward", dropFwd)
	if got := f.send(t, n); len(got) != 0 {
		t.Fatalf("premise: vanilla delivered %d of %d datagrams past the bridge's FORWARD rule", len(got), n)
	}
	del()

	a := modetest.Apply(t, tb, fast.Mode, map[string]string{"x-interval": "100ms"})
	dp := a.Open(t)
	startAgentProcess(t, a)
	waitVouched(t, dp, f, "the flow's entry", func() (int, error) { es, err := dp.Fast().Entries(); return len(es), err })
	tx0, c0 := overlaytest.LinkStats(t, r.OverlayNS(), dst.HostVeth).TxPackets, counters(t, dp)
	got := f.send(t, n)
	same(t, "on the fast path from the VXLAN device", got, vanilla, n)
	c := counters(t, dp).Sub(c0)
	if tx := overlaytest.LinkStats(t, r.OverlayNS(), dst.HostVeth).TxPackets - tx0; tx >= n || c.Fast < n {
		t.Errorf("%s sent %d packets of %d datagrams, %d frames took the fast path (counters %+v): want the fast path to carry them", dst.HostVeth, tx, n, c.Fast, c)
	}

	c0 = counters(t, dp)
	overlaytest.TCP(t, src.NetNS, dst.NetNS, dst.Addr.Addr(), 16<<20)
	if c := counters(t, dp).Sub(c0); c.Fast == 0 || c.FastGSO != 0 {
		t.Errorf("TCP bulk: counters %+v, want its frames, GSO ones too, on the fast path", c)
	}

	del = nftRuleIn(t, r.OverlayNS(), "forward", dropFwd)
	if got := f.send(t, n); len(got) != 0 {
		t.Errorf("%d of %d datagrams sent after the FORWARD rule was added were delivered (vanilla: 0)", len(got), n)
	}
	del()
	a.ResetAndCheck(t, before)
}
