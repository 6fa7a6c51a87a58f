package metrics

import (
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
)

// Captured from a 2-CPU machine, then edited so the deltas are round.
const stat0 = `cpu  4538 0 1693 41598 492 0 52 14 0 0
cpu0 1752 0 645 21793 22 0 9 6 0 0
cpu1 2786 0 1048 19804 469 0 43 8 0 0
intr 12345 0 0
ctxt 67890
btime 1700000000
`

// +100 ticks per CPU: cpu0 user 10 nice 5 system 20 idle 40 iowait 5 irq 5
// softirq 15; cpu1 all idle.
const stat1 = `cpu  4548 5 1713 41738 497 5 67 14 0 0
cpu0 1762 5 665 21833 27 5 24 6 0 0
cpu1 2786 0 1048 19904 469 0 43 8 0 0
intr 22345 0 0
`

const softirqs0 = `                    CPU0       CPU1       
          HI:          0          0
       TIMER:       3937       4348
      NET_TX:          5          0
      NET_RX:       2179       2672
       BLOCK:          0      66893
`

const softirqs1 = `                    CPU0       CPU1       
          HI:          0          0
       TIMER:       3990       4400
      NET_TX:          5          0
      NET_RX:       3179       2682
       BLOCK:          0      66893
`

// 15 hex columns (kernel 6.x): column 13 is the CPU index. The second line
// is CPU 2: CPU 1 is offline, so line numbers are not CPU numbers.
const softnet0 = `00000012 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
00001297 0000000a 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000 00000002 00000000 00000000
`

const softnet1 = `0000ff12 000000ff 00000011 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
00001300 0000000c 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000010 00000000 00000000 00000002 00000000 00000000
`

const snmp0 = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens RetransSegs InErrs
Tcp: 1 200 120000 -1 5 10 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors
Udp: 10 0 3 10 2 0 1
`

const snmp1 = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 200
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens RetransSegs InErrs
Tcp: 1 200 120000 -1 5 17 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors
Udp: 20 0 13 10 10 0 3
`

const netstat0 = `TcpExt: SyncookiesSent TCPOFOQueue TCPDSACKRecv TCPDSACKOfoRecv TCPBacklogDrop
TcpExt: 0 100 4 1 0
IpExt: InNoRoutes InOctets
IpExt: 0 1000
`

const netstat1 = `TcpExt: SyncookiesSent TCPOFOQueue TCPDSACKRecv TCPDSACKOfoRecv TCPBacklogDrop
TcpExt: 0 150 9 2 4
IpExt: InNoRoutes InOctets
IpExt: 0 2000
`

const netdev0 = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0:12345678901234 200 1 7 0 0 0 0 0 0 0 0 0 0 0 0
`

func TestParseStat(t *testing.T) {
	m, err := parseStat([]byte(stat0))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2 {
		t.Fatalf("got %d CPUs, want 2", len(m))
	}
	want := CPUTimes{User: 2786, System: 1048, Idle: 19804, IOWait: 469, SoftIRQ: 43, Steal: 8}
	if m[1] != want {
		t.Errorf("cpu1 = %+v, want %+v", m[1], want)
	}
}

func TestParseSoftirqs(t *testing.T) {
	m, err := parseSoftirqs([]byte(softirqs0), "NET_RX")
	if err != nil {
		t.Fatal(err)
	}
	if m[0] != 2179 || m[1] != 2672 {
		t.Errorf("NET_RX = %v", m)
	}
	if _, err := parseSoftirqs([]byte(softirqs0), "NOPE"); err == nil {
		t.Error("missing row: no error")
	}
}

func TestParseSoftnet(t *testing.T) {
	m, err := parseSoftnet([]byte(softnet0))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m[1]; ok {
		t.Error("line 2 taken as CPU 1; its index column says CPU 2")
	}
	want := Softnet{Processed: 0x1297, Dropped: 10, ReceivedRPS: 3}
	if m[2] != want {
		t.Errorf("cpu2 = %+v, want %+v", m[2], want)
	}
	// Pre-5.10 layout (11 columns, no index): line number is the CPU.
	old, err := parseSoftnet([]byte("0000000a 00000001 00000002 0 0 0 0 0 0 00000004 00000005\n0000000b 0 0 0 0 0 0 0 0 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if old[0] != (Softnet{10, 1, 2, 4, 5}) || old[1].Processed != 11 {
		t.Errorf("old layout = %+v", old)
	}
}

func TestParseSNMP(t *testing.T) {
	m := map[string]uint64{}
	if err := parseSNMP([]byte(snmp0), m); err != nil {
		t.Fatal(err)
	}
	if err := parseSNMP([]byte(netstat0), m); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]uint64{
		"TcpRetransSegs": 10, "UdpRcvbufErrors": 2, "UdpInErrors": 3,
		"TcpExtTCPOFOQueue": 100, "TcpExtTCPDSACKOfoRecv": 1, "IpExtInOctets": 1000,
	} {
		if m[k] != v {
			t.Errorf("%s = %d, want %d", k, m[k], v)
		}
	}
	if _, ok := m["TcpMaxConn"]; ok {
		t.Error("negative TcpMaxConn kept as a counter")
	}
}

func TestParseNetDev(t *testing.T) {
	m, err := parseNetDev([]byte(netdev0))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2 {
		t.Fatalf("devices = %v", m)
	}
	if e := m["eth0"]; e.RxBytes != 12345678901234 || e.RxPackets != 200 || e.RxDropped != 7 {
		t.Errorf("eth0 = %+v", e)
	}
}

// snap builds a Snapshot from fixture text, as Take would from /proc.
func snap(t *testing.T, at time.Time, stat, sirq, snet, snmp, netstat, netdev string, kt map[int]procStat, cfg Config) *Snapshot {
	t.Helper()
	s := &Snapshot{At: at, Kthreads: kt, SNMP: map[string]map[string]uint64{}, Devs: map[Dev]DevStats{}, cfg: cfg}
	var err error
	if s.CPU, err = parseStat([]byte(stat)); err != nil {
		t.Fatal(err)
	}
	if s.NetRX, err = parseSoftirqs([]byte(sirq), "NET_RX"); err != nil {
		t.Fatal(err)
	}
	if s.Softnet, err = parseSoftnet([]byte(snet)); err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	if err := parseSNMP([]byte(snmp), m); err != nil {
		t.Fatal(err)
	}
	if err := parseSNMP([]byte(netstat), m); err != nil {
		t.Fatal(err)
	}
	s.SNMP["c"] = m
	dev, err := parseNetDev([]byte(netdev))
	if err != nil {
		t.Fatal(err)
	}
	s.Devs[Dev{"", "eth0"}] = dev["eth0"]
	return s
}

func TestDiffFixtures(t *testing.T) {
	cfg := Config{RecvNS: []string{"c"}, SendNS: []string{"c"}, NICs: []Dev{{"", "eth0"}}}
	t0 := time.Unix(1700000000, 0)
	netdev1 := `  eth0: 12345678991234 300 1 10 0 0 0 0 0 0 0 0 0 0 0 0` + "\n"
	before := snap(t, t0, stat0, softirqs0, softnet0, snmp0, netstat0, netdev0,
		map[int]procStat{7: {Comm: "napi/eth0-1", Ticks: 100, CPU: 0}}, cfg)
	after := snap(t, t0.Add(time.Second), stat1, softirqs1, softnet1, snmp1, netstat1, netdev1,
		map[int]procStat{
			7: {Comm: "napi/eth0-1", Ticks: 110, CPU: 0},
			8: {Comm: "cpumap/0/map:3", Ticks: 5, CPU: 0}, // born in the window
		}, cfg)
	d := Diff(before, after)

	if len(d.CPU) != 2 {
		t.Fatalf("CPU = %+v", d.CPU)
	}
	c0 := d.CPU[0]
	want := results.CPUUse{CPU: 0, SoftIRQ: 15, System: 25, User: 15, Idle: 45, NetRX: 1000, Kthreads: 15}
	if !near(c0, want) {
		t.Errorf("cpu0 = %+v\nwant   %+v", c0, want)
	}
	if c1 := d.CPU[1]; c1.Idle != 100 || c1.NetRX != 10 || c1.SoftIRQ != 0 {
		t.Errorf("cpu1 = %+v", c1)
	}
	// softnet: CPU0 dropped 0 -> 0xff, CPU2 10 -> 12.
	if d.DropsSoftnet != 0xff+2 || d.TimeSqueeze != 0x10 || d.ReceivedRPS != 0xd {
		t.Errorf("softnet drops %d squeeze %d rps %d", d.DropsSoftnet, d.TimeSqueeze, d.ReceivedRPS)
	}
	if d.Retrans != 7 {
		t.Errorf("Retrans = %d, want 7", d.Retrans)
	}
	if d.DSACK != 5+1 {
		t.Errorf("DSACK = %d, want 6", d.DSACK)
	}
	if d.OFO != 50 {
		t.Errorf("OFO = %d, want 50", d.OFO)
	}
	// UdpInErrors (10, which includes the rcvbuf and csum errors) + backlog 4.
	if d.DropsSocket != 10+4 {
		t.Errorf("DropsSocket = %d, want 14", d.DropsSocket)
	}
	if d.DropsNIC != 3 {
		t.Errorf("DropsNIC = %d, want 3", d.DropsNIC)
	}

	var r results.Run
	d.Apply(&r)
	if r.OFO != 50 || r.DropsNIC != 3 || len(r.CPU) != 2 || r.Extra["rps_ipis"] != 0xd {
		t.Errorf("Apply: %+v", r)
	}
}

func TestSoftnetWrap(t *testing.T) {
	b := &Snapshot{Softnet: map[int]Softnet{0: {Dropped: 0xfffffffe}}}
	a := &Snapshot{Softnet: map[int]Softnet{0: {Dropped: 3}}}
	if d := Diff(b, a); d.DropsSoftnet != 5 {
		t.Errorf("wrapped drops = %d, want 5", d.DropsSoftnet)
	}
}

func near(a, b results.CPUUse) bool {
	f := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	return a.CPU == b.CPU && a.NetRX == b.NetRX && f(a.SoftIRQ, b.SoftIRQ) && f(a.System, b.System) &&
		f(a.User, b.User) && f(a.Idle, b.Idle) && f(a.Kthreads, b.Kthreads)
}

// TestSnapshotLive takes real snapshots around UDP drops provoked in a
// throwaway namespace: a socket with a tiny receive buffer that never
// reads overflows, which UdpRcvbufErrors and UdpInErrors count there, and
// the datagrams cross that namespace's lo.
func TestSnapshotLive(t *testing.T) {
	testenv.Root(t)
	ns := fmt.Sprintf("lanes-metrics-test-%d", os.Getpid())
	if err := nsx.Create(ns); err != nil {
		t.Fatal(err)
	}
	defer nsx.Delete(ns)
	if _, err := nsx.Output(ns, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		RecvNS:   []string{ns},
		SendNS:   []string{ns},
		NICs:     []Dev{{ns, "lo"}},
		Kthreads: []string{"ksoftirqd/*"}, // napi threads may not exist here; ksoftirqd does
	}
	before, err := Take(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const sent = 2000
	err = nsx.Do(ns, func() error {
		rc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return err
		}
		defer rc.Close()
		if err := rc.SetReadBuffer(1); err != nil { // the kernel rounds up to its minimum
			return err
		}
		sc, err := net.DialUDP("udp4", nil, rc.LocalAddr().(*net.UDPAddr))
		if err != nil {
			return err
		}
		defer sc.Close()
		buf := make([]byte, 1000)
		for range sent {
			if _, err := sc.Write(buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := Take(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(before, after)

	if len(d.CPU) != runtime.NumCPU() {
		t.Errorf("%d CPUs in delta, %d online", len(d.CPU), runtime.NumCPU())
	}
	for _, c := range d.CPU {
		sum := c.SoftIRQ + c.System + c.User + c.Idle
		if sum < 0 || sum > 100.001 || c.Kthreads < 0 || c.Kthreads > 100 {
			t.Errorf("cpu%d split out of range: %+v", c.CPU, c)
		}
	}
	if len(after.Kthreads) == 0 {
		t.Error("no ksoftirqd kthreads found")
	}
	if d.Recv["UdpRcvbufErrors"] == 0 || d.DropsSocket < d.Recv["UdpRcvbufErrors"] {
		t.Errorf("rcvbuf errors %d, socket drops %d: want > 0", d.Recv["UdpRcvbufErrors"], d.DropsSocket)
	}
	// Nearly all overflow: the buffer holds a datagram or two. (UdpInDatagrams
	// stays 0: the kernel counts it when the application reads.)
	if d.Recv["UdpInErrors"] < sent/2 {
		t.Errorf("UdpInErrors = %d, want most of %d", d.Recv["UdpInErrors"], sent)
	}
	if got := d.Devs[Dev{ns, "lo"}].RxPackets; got < sent {
		t.Errorf("lo rx packets = %d, want >= %d", got, sent)
	}

	// A namespace that is gone is an error, but the CPU part survives.
	s, err := Take(Config{RecvNS: []string{ns + "-missing"}})
	if err == nil {
		t.Error("missing netns: no error")
	}
	if s == nil || len(s.CPU) == 0 {
		t.Error("missing netns lost the CPU snapshot")
	}
}

func TestSampler(t *testing.T) {
	got := make(chan Sample, 1)
	s := StartSampler(20*time.Millisecond, func(smp Sample) {
		select {
		case got <- smp:
		default:
		}
	})
	smp := <-got
	s.Stop()
	s.Stop()
	if len(smp.CPU) != runtime.NumCPU() || smp.String() == "" {
		t.Errorf("sample %+v", smp)
	}
	t.Log(smp)
}
