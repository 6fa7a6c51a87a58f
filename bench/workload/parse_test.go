package workload

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The testdata files are real outputs of the Debian tools (iperf3 3.12,
// sockperf 3.7, memcaslap 1.1.4, wrk 4.1) captured between two
// namespaces on a veth pair.

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

func TestParseIperf3TCP(t *testing.T) {
	o, err := parseIperf3(readTestdata(t, "iperf3_tcp.json"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := o.result(false)
	if err != nil {
		t.Fatal(err)
	}
	// sum_received: 462616000 bytes in 2.0002 s at 1850278972.1027896 bit/s, -l 1400.
	if !near(r.ThroughputGbps, 1.8502789721027896) {
		t.Errorf("throughput %v", r.ThroughputGbps)
	}
	if want := 462616000.0 / 1400 / 2.0002; !near(r.PPS, want) {
		t.Errorf("pps %v, want %v", r.PPS, want)
	}
	if r.Extra["retransmits"] != 3541 || r.Extra["mean_rtt_us"] != 33 {
		t.Errorf("extra %v", r.Extra)
	}
	if r.SentPPS != 0 || r.UDPReorder != 0 {
		t.Errorf("TCP has no sent pps / reorder: %+v", r)
	}
}

func TestParseIperf3Multi(t *testing.T) {
	o, err := parseIperf3(readTestdata(t, "iperf3_tcp_multi.json"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := o.result(false)
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.ThroughputGbps, 0.706125448856597) || r.Extra["streams"] != 2 {
		t.Errorf("%+v", r)
	}
	if want := 176538600.0 / 1400 / 2.000082; !near(r.PPS, want) {
		t.Errorf("pps %v, want %v", r.PPS, want)
	}
}

func TestParseIperf3UDP(t *testing.T) {
	o, err := parseIperf3(readTestdata(t, "iperf3_udp.json"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := o.result(true)
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.ThroughputGbps, 6.46739773340313) {
		t.Errorf("throughput %v", r.ThroughputGbps)
	}
	// 1616923000 bytes / 1400 = 1154945 datagrams = packets - lost.
	if want := 1154945 / 2.000091; !near(r.PPS, want) {
		t.Errorf("pps %v, want %v", r.PPS, want)
	}
	if want := 1201750 / 2.000018; !near(r.SentPPS, want) {
		t.Errorf("sent pps %v, want %v", r.SentPPS, want)
	}
	if r.Extra["lost_packets"] != 46763 || r.Extra["received_packets"] != 1154945 {
		t.Errorf("extra %v", r.Extra)
	}
	if r.UDPReorder != 0 {
		t.Errorf("reorder %d", r.UDPReorder)
	}
}

func TestParseIperf3Error(t *testing.T) {
	_, err := parseIperf3(readTestdata(t, "iperf3_refused.json"))
	if err == nil || !strings.Contains(err.Error(), "Connection refused") {
		t.Fatalf("err = %v", err)
	}
	if _, err := parseIperf3([]byte("iperf3: garbage")); err == nil {
		t.Fatal("no error on non-JSON")
	}
}

func TestParseSockperf(t *testing.T) {
	s, err := parseSockperf(string(readTestdata(t, "sockperf_pp_udp.txt")))
	if err != nil {
		t.Fatal(err)
	}
	r := s.result("udp", nil)
	want := map[string][2]float64{
		"avg": {r.LatAvgUs, 32.942}, "min": {r.LatMinUs, 2.149}, "p50": {r.LatP50Us, 35.704},
		"p99": {r.LatP99Us, 63.093}, "p99.9": {r.LatP999Us, 194.287},
		"max": {r.Extra["max_us"], 696.934}, "p99.999": {r.Extra["p99.999_us"], 696.934},
		"pps": {r.PPS, 23504 / 1.550}, "observations": {r.Extra["observations"], 23504},
		"std": {r.Extra["std_dev_us"], 16.418},
	}
	for k, v := range want {
		if !near(v[0], v[1]) {
			t.Errorf("%s = %v, want %v", k, v[0], v[1])
		}
	}
	if r.LatCDF != nil {
		t.Errorf("CDF without a full log: %v", r.LatCDF)
	}

	s, err = parseSockperf(string(readTestdata(t, "sockperf_pp_tcp.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if r := s.result("tcp", nil); !near(r.LatP999Us, 334.065) || !near(r.Extra["max_us"], 1093.396) {
		t.Errorf("tcp: %+v", r)
	}
	// One lost message stops ping-pong: said so, with the counts.
	if _, err := parseSockperf(string(readTestdata(t, "sockperf_pp_stalled.txt"))); err == nil ||
		!strings.Contains(err.Error(), "stalled") || !strings.Contains(err.Error(), "sent 133, 132 replies") {
		t.Errorf("stalled ping-pong: %v", err)
	}
	// Paced, a message lost part of the way through leaves sockperf a
	// summary of the messages before it: a stall all the same.
	s, err = parseSockperf(string(readTestdata(t, "sockperf_pp_udp_mps100.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.stalled(100); err != nil {
		t.Errorf("155 messages in 1.54 s at 100/s: %v", err)
	}
	if err := s.stalled(0); err != nil {
		t.Errorf("unpaced: %v", err)
	}
	if err := s.stalled(1000); err == nil || !strings.Contains(err.Error(), "stalled") || !strings.Contains(err.Error(), "155 messages") {
		t.Errorf("155 messages in 1.54 s at 1000/s: %v", err)
	}
	if _, err := parseSockperf(string(readTestdata(t, "sockperf_pp_noserver.txt"))); err == nil ||
		!strings.Contains(err.Error(), "no messages") {
		t.Errorf("no-server output: err = %v", err)
	}
}

func TestParseSockperfFullLog(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "sockperf_fulllog_small.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := parseSockperfFullLog(f)
	if err != nil {
		t.Fatal(err)
	}
	// The summary of the same run (sockperf_pp_udp_small.txt) counts the
	// observations the log lists.
	s, err := parseSockperf(string(readTestdata(t, "sockperf_pp_udp_small.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if uint64(len(samples)) != s.Observations {
		t.Fatalf("%d samples, summary has %d observations", len(samples), s.Observations)
	}
	r := s.result("udp", samples)
	if len(r.LatCDF) != len(cdfFractions) {
		t.Fatalf("CDF has %d points", len(r.LatCDF))
	}
	for i := 1; i < len(r.LatCDF); i++ {
		if r.LatCDF[i].Us < r.LatCDF[i-1].Us || r.LatCDF[i].Fraction <= r.LatCDF[i-1].Fraction {
			t.Fatalf("CDF not monotonic at %d: %v", i, r.LatCDF[i-1:i+1])
		}
	}
	// The summary and the log round the same time differently in the
	// last printed digit (1 ns).
	approx := func(a, b float64) bool { return math.Abs(a-b) <= 0.0015 }
	last := r.LatCDF[len(r.LatCDF)-1]
	if last.Fraction != 1 || !approx(last.Us, s.MaxUs) {
		t.Errorf("CDF ends at %+v, max %v", last, s.MaxUs)
	}
	// sockperf's own percentiles are nearest-rank over the same samples.
	if got := quantileSorted(samples, 0.5); !approx(got, s.Percentiles["50"]) {
		t.Errorf("log p50 %v, summary %v", got, s.Percentiles["50"])
	}
	if !approx(samples[0], s.MinUs) {
		t.Errorf("log min %v, summary %v", samples[0], s.MinUs)
	}
}

func TestParseMemaslap(t *testing.T) {
	for _, name := range []string{"memaslap.txt", "memaslap_periodic.txt"} {
		t.Run(name, func(t *testing.T) {
			o, err := parseMemaslap(string(readTestdata(t, name)))
			if err != nil {
				t.Fatal(err)
			}
			if o.Get == nil || o.Set == nil || o.Total == nil {
				t.Fatalf("missing blocks: %+v", o)
			}
			var n uint64
			for _, c := range o.Total.Dist {
				n += c
			}
			if n != o.Total.Events {
				t.Errorf("histogram sums to %d, %d events", n, o.Total.Events)
			}
			r := o.result()
			if r.PPS != o.TPS || r.PPS <= 0 || r.LatAvgUs <= 0 || r.ThroughputGbps <= 0 {
				t.Errorf("%+v", r)
			}
			if !(r.LatMinUs <= r.LatP50Us && r.LatP50Us <= r.LatP99Us && r.LatP99Us <= r.LatP999Us && r.LatP999Us <= o.Total.MaxUs) {
				t.Errorf("quantiles out of order: min %v p50 %v p99 %v p99.9 %v max %v",
					r.LatMinUs, r.LatP50Us, r.LatP99Us, r.LatP999Us, o.Total.MaxUs)
			}
			if c := r.LatCDF; len(c) == 0 || c[len(c)-1].Fraction != 1 || c[len(c)-1].Us != o.Total.MaxUs {
				t.Errorf("CDF %v", c)
			}
		})
	}
	o, err := parseMemaslap(string(readTestdata(t, "memaslap.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if o.TPS != 169218 || o.Ops != 338462 || o.RunTimeS != 2.0 {
		t.Errorf("run line: %+v", o)
	}
	if o.Counters["cmd_get"] != 304609 || o.Counters["get_misses"] != 0 || o.Counters["read_bytes"] != 193688006 {
		t.Errorf("counters %v", o.Counters)
	}
	if _, ok := o.Counters["concurrency"]; ok {
		t.Error("header line taken for a counter")
	}
	tot := o.Total
	if tot.Events != 338446 || tot.MinUs != 10 || tot.MaxUs != 5559 || tot.AvgUs != 94 || tot.Dist[13] != 48 || tot.Dist[4] != 6 {
		t.Errorf("total block %+v", tot)
	}
	// Buckets 4..7 hold 6+843+111162+181494 = 293505 of 338446 (86.7%):
	// the median is in bucket 7, (64, 128] µs.
	if p := tot.quantile(0.5); p <= 64 || p > 128 {
		t.Errorf("p50 %v outside bucket 7", p)
	}
	if _, err := parseMemaslap(string(readTestdata(t, "memaslap_refused.txt"))); err == nil {
		t.Error("no error on a run without results")
	}
}

func TestParseWrk(t *testing.T) {
	o, err := parseWrk(string(readTestdata(t, "wrk.txt")))
	if err != nil {
		t.Fatal(err)
	}
	r := o.result()
	checks := map[string][2]float64{
		"rps": {r.PPS, 89437.77}, "gbps": {r.ThroughputGbps, 63.97 * (1 << 20) * 8 / 1e9},
		"avg": {r.LatAvgUs, 103.55}, "p50": {r.LatP50Us, 84}, "p99": {r.LatP99Us, 722},
		"p90": {r.Extra["p90_us"], 127}, "max": {r.Extra["max_us"], 4410}, "requests": {r.Extra["requests"], 188004},
	}
	for k, v := range checks {
		if !near(v[0], v[1]) {
			t.Errorf("%s = %v, want %v", k, v[0], v[1])
		}
	}
	if r.LatP999Us != 0 || r.LatCDF != nil {
		t.Errorf("plain wrk output has no p99.9 or CDF: %+v", r)
	}
}

func TestParseWrkScript(t *testing.T) {
	o, err := parseWrk(string(readTestdata(t, "wrk_lua.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if !o.hasScript {
		t.Fatal("LANES lines not seen")
	}
	r := o.result()
	if want := 110910 / 2.111010; !near(r.PPS, want) {
		t.Errorf("rps %v, want %v (exact, from the script)", r.PPS, want)
	}
	if want := 83181980 * 8 / 2.111010 / 1e9; !near(r.ThroughputGbps, want) {
		t.Errorf("gbps %v, want %v", r.ThroughputGbps, want)
	}
	if r.LatMinUs != 13 || !near(r.LatAvgUs, 871.857737) || r.Extra["max_us"] != 25821 {
		t.Errorf("latency %+v", r)
	}
	if len(r.LatCDF) != len(cdfFractions) {
		t.Fatalf("CDF has %d points, want %d", len(r.LatCDF), len(cdfFractions))
	}
	if last := r.LatCDF[len(r.LatCDF)-1]; last.Fraction != 1 || last.Us != 25821 {
		t.Errorf("CDF ends at %+v, want the max 25821 µs", last)
	}
	// Script and --latency agree up to wrk's rounding.
	if math.Abs(r.LatP50Us-o.Dist["50"]) > 1 || r.LatP999Us < r.LatP99Us {
		t.Errorf("p50 %v vs %v, p99 %v p99.9 %v", r.LatP50Us, o.Dist["50"], r.LatP99Us, r.LatP999Us)
	}

	o, err = parseWrk(string(readTestdata(t, "wrk_404.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if o.Non2xx != 30068 || o.Non2xx != o.Requests || o.Errors["status"] != 30068 {
		t.Errorf("404 run: %+v", o)
	}
	if _, err := parseWrk(string(readTestdata(t, "wrk_refused.txt"))); err == nil {
		t.Error("no error for a refused run")
	}
}

func TestParseProcAddr(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 010012C6:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:2B67 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 100 0 0 10 0
   2: 010012C6:2B66 020012C6:D3A2 01 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
`)
	a := netip.MustParseAddr("198.18.0.1")
	in := func(inodes ...string) map[string]bool {
		m := map[string]bool{}
		for _, i := range inodes {
			m[i] = true
		}
		return m
	}
	cases := []struct {
		port   int
		inodes map[string]bool
		want   bool
	}{
		{5201, in("4242"), true},
		{5201, in("9999"), false},  // someone else's socket
		{11111, in("4343"), true},  // wildcard bind
		{11110, in("4444"), false}, // established, not listening
	}
	for _, c := range cases {
		if got := socketInTable(table, "tcp", a, c.port, c.inodes); got != c.want {
			t.Errorf("port %d inodes %v: %v, want %v", c.port, c.inodes, got, c.want)
		}
	}
	// IPv6 table, v4-mapped ::ffff:198.18.0.1 port 80.
	v6 := []byte("hdr\n 0: 0000000000000000FFFF0000010012C6:0050 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 77 1\n")
	if !socketInTable(v6, "tcp", a, 80, in("77")) {
		t.Error("v4-mapped IPv6 listener not matched")
	}
}

func TestCDFGrid(t *testing.T) {
	if n := len(cdfFractions); n < 100 || n > 200 {
		t.Errorf("%d CDF points", n)
	}
	for i, f := range cdfFractions {
		if i > 0 && f <= cdfFractions[i-1] {
			t.Fatalf("grid not increasing at %d", i)
		}
	}
	if pctLabel(0.999) != "99.9" || pctLabel(0.29) != "29" || pctLabel(0.9991) != "99.91" {
		t.Error(pctLabel(0.999), pctLabel(0.29), pctLabel(0.9991))
	}
}

func TestRegistry(t *testing.T) {
	want := []string{"memcached", "nginx", "pingpong", "tcp_multi", "tcp_stream", "udp_stream"}
	if got := strings.Join(Names(), ","); got != strings.Join(want, ",") {
		t.Errorf("Names() = %s", got)
	}
	for _, n := range want {
		w, err := Lookup(n)
		if err != nil || w.Name() != n {
			t.Errorf("Lookup(%s) = %v, %v", n, w, err)
		}
	}
	if _, err := Lookup("udp_stress"); err == nil || !strings.Contains(err.Error(), "tcp_stream") {
		t.Errorf("unknown name: %v", err)
	}
	if err := Register(PingPong{}); err == nil {
		t.Error("duplicate registration accepted")
	}
}

func TestMissingTool(t *testing.T) {
	_, err := tool{names: []string{"lanes-no-such-tool"}, pkg: "lanes-pkg"}.path()
	if err == nil || !strings.Contains(err.Error(), "install the Debian package lanes-pkg") {
		t.Errorf("err = %v", err)
	}
}

func TestHelpers(t *testing.T) {
	if divisorAtMost(16, 3) != 2 || divisorAtMost(12, 4) != 4 || divisorAtMost(7, 4) != 1 || divisorAtMost(2, 8) != 2 {
		t.Error("divisorAtMost")
	}
	if wholeSeconds(0) != 1 || wholeSeconds(2e9) != 2 || wholeSeconds(2.1e9) != 3 {
		t.Error("wholeSeconds")
	}
}

func TestPacedArgsRoundTrip(t *testing.T) {
	a := pacedArgs{
		Server:   netip.MustParseAddrPort("198.18.0.2:11111"),
		ClientIP: netip.MustParseAddr("198.18.0.1"),
		Rate:     1000, Size: 64, Duration: 5 * time.Second, Warmup: pacedWarmup, Log: "/tmp/x",
	}
	got, err := parsePacedArgs(a.argv())
	if err != nil || got != a {
		t.Fatalf("parsePacedArgs(argv()) = %+v, %v; want %+v", got, err, a)
	}
	for _, bad := range [][]string{
		{"-server", "198.18.0.2", "-log", "x"},                     // no port
		{"-server", "[::1]:1", "-log", "x"},                        // not IPv4
		{"-server", "198.18.0.2:1", "-log", "x", "-rate", "0"},     // no rate
		{"-server", "198.18.0.2:1", "-log", "x", "-size", "13"},    // shorter than the header
		{"-server", "198.18.0.2:1"},                                // no log
		{"-server", "198.18.0.2:1", "-log", "x", "-duration", "0"}, // nothing to measure
	} {
		if _, err := parsePacedArgs(bad); err == nil {
			t.Errorf("parsePacedArgs(%q): no error", bad)
		}
	}
}

func TestPacedSummaryAsSockperf(t *testing.T) {
	lat := []float64{30, 10, 20, 40}
	s := pacedSummary{MeasuredS: 0.004, Sent: 5, Received: 4, Lost: 1}
	r := s.asSockperf(append([]float64(nil), lat...)).result("udp", append([]float64(nil), lat...))
	if r.LatAvgUs != 25 || r.LatMinUs != 10 || r.Extra["max_us"] != 40 || r.LatP50Us != 20 || r.LatP99Us != 40 {
		t.Errorf("avg %v min %v max %v p50 %v p99 %v: want 25 10 40 20 40", r.LatAvgUs, r.LatMinUs, r.Extra["max_us"], r.LatP50Us, r.LatP99Us)
	}
	if r.Extra["dropped"] != 1 || r.Extra["observations"] != 4 || r.PPS != 1000 {
		t.Errorf("dropped %v observations %v PPS %v: want 1 4 1000", r.Extra["dropped"], r.Extra["observations"], r.PPS)
	}
	if sd := r.Extra["std_dev_us"]; math.Abs(sd-math.Sqrt(125)) > 1e-9 {
		t.Errorf("std dev %v, want %v", sd, math.Sqrt(125))
	}
	// Half the messages the rate asked for answered at least.
	if err := (pacedSummary{MeasuredS: 1, Received: 500}).short(1000); err != nil {
		t.Errorf("500 of 1000: %v", err)
	}
	if err := (pacedSummary{MeasuredS: 1, Received: 499, Lost: 24, Skipped: 477}).short(1000); !errors.Is(err, errNoResult) {
		t.Errorf("499 of 1000: err = %v, want errNoResult", err)
	}
	// The per-message log is sockperf's --full-log table: its parser
	// reads half of each round trip back.
	path := filepath.Join(t.TempDir(), "log")
	samples := []pacedSample{{seq: 7, tx: time.Second, rx: time.Second + 60*time.Microsecond}, {seq: 8, tx: 2 * time.Second, rx: 2*time.Second + 3*time.Microsecond}}
	if err := writeLatencies(path, samples); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, err := parseSockperfFullLog(f); err != nil || len(got) != 2 || got[0] != 30 || got[1] != 1.5 {
		t.Errorf("the log read back as %v, %v; want [30 1.5]", got, err)
	}
}

// sockperf's throughput client and server, as sockperf 3.7 prints them
// (colour escapes included, which the parsers strip).
func TestParseSockperfTP(t *testing.T) {
	client := "sockperf: Test end (interrupted by timer)\nsockperf: Test ended\n" +
		"sockperf: Total of 200028 messages sent in 2.001 sec\n\n" +
		"sockperf: \x1b[2;35mNOTE: test was performed, using msg-size=64, mps=100000.\x1b[0m\n" +
		"sockperf: Summary: Message Rate is 99980 [msg/sec]\n"
	sent, secs, err := parseSockperfTPClient(client)
	if err != nil || sent != 200028 || secs != 2.001 {
		t.Errorf("client: %d in %v s (%v), want 200028 in 2.001 s", sent, secs, err)
	}
	server := "sockperf: [tid 551] using recvfrom() to block on socket(s)\n" +
		"sockperf: Test end (interrupted by user)\nsockperf: Total 49866 messages received and handled\n"
	if got, err := parseSockperfTPServer(server); err != nil || got != 49866 {
		t.Errorf("server: %d (%v), want 49866", got, err)
	}
	for _, bad := range []string{"", "sockperf: Test ended\n", "sockperf: Total of 5 messages sent in 0.000 sec\n"} {
		if _, _, err := parseSockperfTPClient(bad); !errors.Is(err, errNoResult) {
			t.Errorf("client %q: %v, want errNoResult", bad, err)
		}
	}
	if got, err := parseSockperfTPServer("sockperf: Test end (interrupted by user)\nsockperf: No messages were received on the server.\n"); err != nil || got != 0 {
		t.Errorf("server that got nothing: %d (%v), want 0", got, err)
	}
	if _, err := parseSockperfTPServer("sockperf: [SERVER] listen on:\n"); !errors.Is(err, errNoResult) {
		t.Errorf("server without a count: %v, want errNoResult", err)
	}
}
