package workload

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
)

// End-to-end tests: each runs the real tools between two throwaway
// namespaces joined by a veth pair, addressed from 198.18.0.0/15 (the
// benchmarking range) only, and checks that the numbers are there and
// consistent, never how large they are, and that nothing outlives Run.

const e2eDuration = 2 * time.Second

// Keep the main goroutine, and so the test binary's main thread, to
// itself. nsx.Do leaves a goroutine locked to a thread it moved into
// another namespace so that the thread dies with it; but when that thread
// is the main one the Go runtime cannot end it and parks it for good,
// inside the foreign namespace. Linux shows the main thread's namespace
// as the process's (/proc/PID/ns/net, /proc/self/net), so the test binary
// would look, to assertNothingLeft, like a process left in a test
// namespace. Programs using nsx need the same guard (in nsx or main).
func init() { runtime.LockOSThread() }

var netSeq atomic.Int32

// testNet is a server and a client namespace on a veth pair.
type testNet struct {
	srv, cli Endpoint
}

func requireTools(t *testing.T, tools ...tool) {
	t.Helper()
	for _, tl := range tools {
		if _, err := tl.path(); err != nil {
			t.Skip(err)
		}
	}
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newTestNet makes the namespaces (deleted in t.Cleanup, which also checks
// they are gone) and points TMPDIR at a directory that must end up empty.
func newTestNet(t *testing.T) testNet {
	t.Helper()
	testenv.Root(t)
	n := netSeq.Add(1)
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, n)
	nsS, nsC := "lanes-wlt-"+id+"-s", "lanes-wlt-"+id+"-c"
	vS, vC := "lwt"+id+"s", "lwt"+id+"c" // <= 15 bytes
	for _, ns := range []string{nsS, nsC} {
		if err := nsx.Create(ns); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, ns := range []string{nsS, nsC} {
			if err := nsx.Delete(ns); err != nil {
				t.Error(err)
			}
			if nsx.Exists(ns) {
				t.Errorf("netns %s left behind", ns)
			}
		}
	})
	// Deleting the namespaces destroys the veth pair with them.
	ipCmd(t, "link", "add", vS, "netns", nsS, "type", "veth", "peer", "name", vC, "netns", nsC)
	sAddr := netip.AddrFrom4([4]byte{198, 18, byte(n), 1})
	cAddr := netip.AddrFrom4([4]byte{198, 18, byte(n), 2})
	ipCmd(t, "-n", nsS, "addr", "add", sAddr.String()+"/30", "dev", vS)
	ipCmd(t, "-n", nsC, "addr", "add", cAddr.String()+"/30", "dev", vC)
	for _, x := range [][2]string{{nsS, vS}, {nsC, vC}, {nsS, "lo"}, {nsC, "lo"}} {
		ipCmd(t, "-n", x[0], "link", "set", x[1], "up")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Cleanup(func() {
		if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
			t.Errorf("left in TMPDIR: %v", ents)
		}
	})
	tn := testNet{
		srv: Endpoint{NetNS: nsS, Addr: sAddr},
		cli: Endpoint{NetNS: nsC, Addr: cAddr},
	}
	// Pin as the runner will, when there are CPUs to pin to.
	if runtime.NumCPU() >= 2 {
		tn.srv.CPUs, tn.cli.CPUs = []int{0}, []int{1}
	}
	return tn
}

// assertNothingLeft fails if any process still runs in the test's
// namespaces or this process has unreaped children.
func assertNothingLeft(t *testing.T, tn testNet) {
	t.Helper()
	for _, ns := range []string{tn.srv.NetNS, tn.cli.NetNS} {
		var want syscall.Stat_t
		if err := syscall.Stat(nsx.Path(ns), &want); err != nil {
			t.Fatal(err)
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
		for _, p := range procs {
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
				pid := strings.Split(p, "/")[2]
				cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
				t.Errorf("process %s still runs in netns %s: %s", pid, ns, strings.ReplaceAll(string(cmdline), "\x00", " "))
			}
		}
	}
	kids, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	for _, k := range kids {
		if b, _ := os.ReadFile(k); len(strings.TrimSpace(string(b))) > 0 {
			t.Errorf("unreaped children: %s", b)
		}
	}
}

func run(t *testing.T, name string, tn testNet, p Point) Result {
	t.Helper()
	w, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return runW(t, w, tn, p)
}

func runW(t *testing.T, w Workload, tn testNet, p Point) Result {
	t.Helper()
	name := w.Name()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r, err := w.Run(ctx, tn.srv, tn.cli, p)
	t.Logf("%s: %v in %v: %+v", name, err, time.Since(start).Round(time.Millisecond), r)
	assertNothingLeft(t, tn)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func positive(t *testing.T, what string, v float64) {
	t.Helper()
	if !(v > 0) || math.IsInf(v, 0) {
		t.Errorf("%s = %v, want > 0", what, v)
	}
}

// latencyOrdered checks min <= p50 <= p99 <= p99.9 and a monotonic CDF.
func latencyOrdered(t *testing.T, r Result) {
	t.Helper()
	positive(t, "LatAvgUs", r.LatAvgUs)
	positive(t, "LatP50Us", r.LatP50Us)
	if !(r.LatMinUs <= r.LatP50Us && r.LatP50Us <= r.LatP99Us && r.LatP99Us <= r.LatP999Us) {
		t.Errorf("latencies out of order: min %v p50 %v p99 %v p99.9 %v", r.LatMinUs, r.LatP50Us, r.LatP99Us, r.LatP999Us)
	}
	if len(r.LatCDF) == 0 {
		t.Error("no CDF")
	}
	for i := 1; i < len(r.LatCDF); i++ {
		if r.LatCDF[i].Us < r.LatCDF[i-1].Us || r.LatCDF[i].Fraction <= r.LatCDF[i-1].Fraction {
			t.Fatalf("CDF not monotonic at %d: %v", i, r.LatCDF[i-1:i+1])
		}
	}
}

func TestE2ETCPStream(t *testing.T) {
	requireTools(t, toolIperf3)
	tn := newTestNet(t)
	r := run(t, "tcp_stream", tn, Point{MsgSize: 1400, Flows: 1, Duration: e2eDuration, Port: 5301})
	positive(t, "ThroughputGbps", r.ThroughputGbps)
	positive(t, "PPS", r.PPS)
	// Both come from the same receiver byte count.
	if got := r.PPS * 1400 * 8 / 1e9; math.Abs(got-r.ThroughputGbps) > 0.01*r.ThroughputGbps {
		t.Errorf("PPS*size = %v Gbit/s, throughput %v", got, r.ThroughputGbps)
	}
}

func TestE2EUDPStream(t *testing.T) {
	requireTools(t, toolIperf3)
	tn := newTestNet(t)
	r := run(t, "udp_stream", tn, Point{MsgSize: 1400, Flows: 1, Duration: e2eDuration})
	positive(t, "ThroughputGbps", r.ThroughputGbps)
	positive(t, "PPS", r.PPS)
	positive(t, "SentPPS", r.SentPPS)
	if r.PPS > r.SentPPS*1.01 {
		t.Errorf("received %v/s > sent %v/s", r.PPS, r.SentPPS)
	}
	if l := r.Extra["lost_pct"]; l < 0 || l > 100 {
		t.Errorf("lost_pct %v", l)
	}
}

func TestE2ETCPMulti(t *testing.T) {
	requireTools(t, toolIperf3)
	tn := newTestNet(t)
	r := run(t, "tcp_multi", tn, Point{MsgSize: 16384, Flows: 2, Duration: e2eDuration})
	positive(t, "ThroughputGbps", r.ThroughputGbps)
	positive(t, "PPS", r.PPS)
	if r.Extra["streams"] != 2 {
		t.Errorf("streams = %v, want 2", r.Extra["streams"])
	}
}

func TestE2EPingPong(t *testing.T) {
	requireTools(t, toolSockperf)
	for _, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			tn := newTestNet(t)
			r := run(t, "pingpong", tn, Point{Proto: proto, MsgSize: 64, Flows: 1, Duration: e2eDuration})
			positive(t, "PPS", r.PPS)
			latencyOrdered(t, r)
			if len(r.LatCDF) != len(cdfFractions) {
				t.Errorf("CDF has %d points, want %d", len(r.LatCDF), len(cdfFractions))
			}
			positive(t, "observations", r.Extra["observations"])
		})
	}
}

// lanes' paced client against the sockperf server: every message answered,
// at the rate asked, and the run's figures built as sockperf's client's.
func TestE2EPacedPingPong(t *testing.T) {
	requireTools(t, toolSockperf)
	tn := newTestNet(t)
	const rate = 1000
	for _, spin := range []bool{false, true} {
		r := runW(t, PingPong{Paced: true, Spin: spin}, tn, Point{Proto: "udp", MsgSize: 64, Flows: 1, Rate: rate, Duration: e2eDuration})
		latencyOrdered(t, r)
		if len(r.LatCDF) != len(cdfFractions) {
			t.Errorf("spin %v: CDF has %d points, want %d", spin, len(r.LatCDF), len(cdfFractions))
		}
		// Every slot sent or (a stall of the machine longer than the
		// client catches up from) skipped, and every message sent
		// measured. How many a busy machine makes the client skip is
		// timing, not correctness: logged, not asserted.
		want := rate * e2eDuration.Seconds()
		if n := r.Extra["sent"] + r.Extra["skipped"]; n != want || r.Extra["sent"] == 0 || r.Extra["observations"] != r.Extra["sent"] {
			t.Errorf("spin %v: sent %v + skipped %v, %v observations: want %v slots, the sent ones all measured", spin, r.Extra["sent"], r.Extra["skipped"], r.Extra["observations"], want)
		}
		t.Logf("spin %v: %v of %v slots skipped (%v sent late)", spin, r.Extra["skipped"], want, r.Extra["sent_late"])
		if r.Extra["sent"] != r.Extra["received"] || r.Extra["dropped"] != 0 {
			t.Errorf("spin %v: sent %v, received %v, dropped %v: want every message answered on an idle testbed", spin, r.Extra["sent"], r.Extra["received"], r.Extra["dropped"])
		}
		if r.PPS > rate {
			t.Errorf("spin %v: PPS = %v, want at most %d (the pace asked)", spin, r.PPS, rate)
		}
		if r.Extra["paced_client"] != 1 || r.Extra["paced_spin"] != map[bool]float64{true: 1}[spin] {
			t.Errorf("spin %v: paced_client %v, paced_spin %v", spin, r.Extra["paced_client"], r.Extra["paced_spin"])
		}
	}
	// TCP, or no rate, is refused before anything starts.
	for _, p := range []Point{{Proto: "tcp", Rate: rate, Duration: time.Second}, {Proto: "udp", Duration: time.Second}} {
		if _, err := (PingPong{Paced: true}).Run(context.Background(), tn.srv, tn.cli, p); err == nil || !strings.Contains(err.Error(), "paced client") {
			t.Errorf("%+v: err = %v, want the paced client's refusal", p, err)
		}
	}
	assertNothingLeft(t, tn)
}

// A lost reply costs the paced client the slots that go by while it waits
// (skipped, counted), never a catch-up burst, and the run ends on time.
// The server here answers sockperf's way but drops message 5's reply.
func TestPacedLossSkipsSlots(t *testing.T) {
	testenv.Root(t)
	tn := newTestNet(t)
	const port = 11500
	var srvFD int
	if err := nsx.Do(tn.srv.NetNS, func() (err error) {
		srvFD, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return unix.Bind(srvFD, &unix.SockaddrInet4{Addr: tn.srv.Addr.As4(), Port: port})
	}); err != nil {
		t.Fatal(err)
	}
	var answered atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := unix.Recvfrom(srvFD, buf, 0)
			if err != nil {
				return // closed by the test's end
			}
			if k < spHeaderLen || binary.BigEndian.Uint64(buf[0:8]) == 5 {
				continue
			}
			binary.BigEndian.PutUint16(buf[8:10], binary.BigEndian.Uint16(buf[8:10])&^spFlagClient)
			_ = unix.Sendto(srvFD, buf[:k], 0, from)
			answered.Add(1)
		}
	}()
	t.Cleanup(func() { unix.Shutdown(srvFD, unix.SHUT_RDWR); unix.Close(srvFD) })

	a := pacedArgs{Server: netip.AddrPortFrom(tn.srv.Addr, port), ClientIP: tn.cli.Addr, Rate: 1000, Size: 64, Duration: 300 * time.Millisecond}
	var (
		lat []pacedSample
		sum pacedSummary
	)
	began := time.Now()
	if err := nsx.Do(tn.cli.NetNS, func() error {
		fd, err := pacedSocket(a)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		lat, sum, err = pacedRun(fd, a)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	// 300 slots: one lost, the ~20 that pass during its 20 ms wait
	// skipped, every other one sent and answered
	// (more skipped if this shared VM stalls the client for longer than it
	// catches up from).
	if sum.Lost != 1 || sum.Skipped < 15 || sum.Skipped > 120 || sum.Sent+sum.Skipped != 300 || sum.Received != sum.Sent-1 || len(lat) != int(sum.Received) {
		t.Errorf("summary %+v with %d latencies: want 1 lost, about 20 skipped, sent + skipped = 300, the rest answered", sum, len(lat))
	}
	if sum.MeasuredS != 0.3 {
		t.Errorf("measured %v s, want 0.3", sum.MeasuredS)
	}
	if took > time.Second {
		t.Errorf("the run took %v for 300 ms of slots", took)
	}
	assertNothingLeft(t, tn)
}

func TestE2EMemcached(t *testing.T) {
	requireTools(t, toolMemcached, toolMemaslap)
	tn := newTestNet(t)
	r := run(t, "memcached", tn, Point{Flows: 4, Duration: e2eDuration})
	positive(t, "PPS", r.PPS)
	positive(t, "ThroughputGbps", r.ThroughputGbps)
	positive(t, "get_per_sec", r.Extra["get_per_sec"])
	latencyOrdered(t, r)
}

func TestE2ENginx(t *testing.T) {
	requireTools(t, toolNginx, toolWrk)
	for _, c := range []struct {
		name string
		w    Workload
	}{
		{"single-process", Nginx{}},
		{"master+2-workers", Nginx{Workers: 2}}, // workers must die with the master
	} {
		t.Run(c.name, func(t *testing.T) {
			tn := newTestNet(t)
			r := runW(t, c.w, tn, Point{Flows: 4, Duration: e2eDuration})
			positive(t, "PPS", r.PPS)
			positive(t, "ThroughputGbps", r.ThroughputGbps)
			latencyOrdered(t, r)
			if r.Extra["non_2xx_3xx"] != 0 {
				t.Errorf("%v error responses", r.Extra["non_2xx_3xx"])
			}
		})
	}
}

// Cancelling the context stops a run promptly and still cleans up.
func TestE2ECancel(t *testing.T) {
	requireTools(t, toolIperf3)
	tn := newTestNet(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	start := time.Now()
	_, err := Iperf3{WorkloadName: "tcp_stream"}.Run(ctx, tn.srv, tn.cli, Point{MsgSize: 1400, Duration: 60 * time.Second})
	took := time.Since(start)
	assertNothingLeft(t, tn)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if took > 10*time.Second {
		t.Errorf("cancel took %v", took)
	}
}

// A server that cannot start fails Run at once, with the tool's words.
func TestE2EServerFails(t *testing.T) {
	requireTools(t, toolIperf3)
	tn := newTestNet(t)
	srv := tn.srv
	srv.Addr = netip.MustParseAddr("198.19.255.254") // on no interface: bind fails
	start := time.Now()
	w, err := Lookup("tcp_stream")
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Run(context.Background(), srv, tn.cli, Point{Duration: e2eDuration})
	assertNothingLeft(t, tn)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") ||
		!strings.Contains(strings.ToLower(err.Error()), "assign requested address") {
		t.Fatalf("err = %v", err)
	}
	if took := time.Since(start); took > readyTimeout/2 {
		t.Errorf("failure noticed after %v", took)
	}
}

// Processes inherit the namespace and pinning; the Go runtime's threads
// keep their affinity.
func TestStartPinsAndNamespaces(t *testing.T) {
	testenv.Root(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	tn := newTestNet(t)
	s, err := newSession("pin")
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	sh := tool{names: []string{"sh"}, pkg: "dash"}
	for _, ep := range []Endpoint{{CPUs: []int{1}}, {NetNS: tn.srv.NetNS, CPUs: []int{1}},
		{CPUs: []int{1}, idle: true}, {NetNS: tn.srv.NetNS, CPUs: []int{1}, idle: true}} {
		// Field 41 of stat is the scheduling policy (sh's comm has no
		// spaces): 5 is SCHED_IDLE, 0 normal.
		p, err := s.start(ep, "sh", sh, []string{"-c",
			"grep Cpus_allowed_list /proc/self/status; cat /proc/net/dev | wc -l; cut -d' ' -f41 /proc/self/stat"}, "pin.out", "")
		if err != nil {
			t.Fatal(err)
		}
		<-p.exited
		p.stop()
		out, _ := os.ReadFile(p.outPath)
		lines := strings.Fields(string(out))
		if len(lines) != 4 || lines[1] != "1" {
			t.Fatalf("%+v: %q", ep, out)
		}
		// /proc/net/dev: 2 header lines + lo + the veth end in the test netns.
		if ep.NetNS != "" && lines[2] != "4" {
			t.Errorf("child sees %s lines of /proc/net/dev, not its namespace's", lines[2])
		}
		if want := map[bool]string{false: "0", true: "5"}[ep.idle]; lines[3] != want {
			t.Errorf("%+v: the child's policy is %s, want %s", ep, lines[3], want)
		}
	}
	// No runtime thread of ours kept a child's pinning or SCHED_IDLE.
	tasks, _ := filepath.Glob("/proc/self/task/*")
	for _, ts := range tasks {
		b, _ := os.ReadFile(ts + "/status")
		for _, ln := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(ln, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) == "1" {
				t.Errorf("%s: a runtime thread kept the child's pinning", ts)
			}
		}
		b, _ = os.ReadFile(ts + "/stat")
		// comm may hold spaces: count fields after its closing parenthesis.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 38 && f[38] == "5" {
				t.Errorf("%s: a runtime thread kept SCHED_IDLE", ts)
			}
		}
	}
}

// sockperf's throughput client at a paced rate, in bursts, at SCHED_IDLE:
// what it sent and what its server counted are there and consistent.
func TestE2ESockperfThroughput(t *testing.T) {
	requireTools(t, toolSockperf)
	tn := newTestNet(t)
	r := runW(t, SockperfThroughput{Burst: 4, Idle: true}, tn, Point{Proto: "udp", MsgSize: 64, Rate: 2000, Duration: e2eDuration})
	positive(t, "SentPPS", r.SentPPS)
	positive(t, "PPS", r.PPS)
	sent, got, lost := r.Extra["udp_sent"], r.Extra["udp_received"], r.Extra["udp_lost"]
	if got > sent || lost != sent-got {
		t.Errorf("sent %v, received %v, lost %v: the counts do not add up", sent, got, lost)
	}
	if _, err := (SockperfThroughput{}).Run(context.Background(), tn.srv, tn.cli, Point{Proto: "udp", Duration: e2eDuration}); err == nil {
		t.Error("no error without a rate")
	}
}
