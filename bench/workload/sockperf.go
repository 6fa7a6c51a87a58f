package workload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// PingPong measures request/response latency with sockperf ping-pong.
//
// Server: sockperf sr [--tcp] -i <srv addr> -p <port>
// Client: sockperf pp [--tcp] -i <srv addr> -p <port> -t <secs>
//
//	--full-log <file> [-m <msg size>] [--mps <rate>] [--client_ip <cli addr>]
//
// Latency is sockperf's default, one-way = RTT/2, in µs. Point.Proto
// selects udp (default, as in PRISM) or tcp.
type PingPong struct {
	// Paced runs lanes' paced client (paced.go) against the sockperf
	// server instead of sockperf's client, which busy-waits between
	// messages: for a paced UDP ping-pong (Point.Rate > 0) that shares
	// its core with the stress generator.
	Paced bool
	// Spin has the paced client keep its core from halting between
	// messages, as sockperf's client does, where nothing else (the stress
	// generator) keeps it busy (paced.go says why).
	Spin bool
}

const defaultSockperfPort = 11111

func (PingPong) Name() string { return "pingpong" }

func (w PingPong) Run(ctx context.Context, srv, cli Endpoint, p Point) (Result, error) {
	srv, cli = unmapped(srv), unmapped(cli)
	if err := checkEndpoints(w.Name(), srv, cli); err != nil {
		return Result{}, err
	}
	proto := strings.ToLower(p.Proto)
	if proto == "" {
		proto = "udp"
	}
	if proto != "udp" && proto != "tcp" {
		return Result{}, fmt.Errorf("%s: proto %q: want udp or tcp", w.Name(), p.Proto)
	}
	if w.Paced && (proto != "udp" || p.Rate <= 0) {
		return Result{}, fmt.Errorf("%s: the paced client sends UDP at a rate: got proto %s, rate %d messages/s", w.Name(), proto, p.Rate)
	}
	s, err := newSession(w.Name())
	if err != nil {
		return Result{}, err
	}
	defer s.close()

	port := portOr(p, defaultSockperfPort)
	addr := srv.Addr.String()
	common := []string{"-i", addr, "-p", itoa(port)}
	if proto == "tcp" {
		common = append([]string{"--tcp"}, common...)
	}
	sp, err := s.start(srv, "sockperf-server", toolSockperf, append([]string{"sr"}, common...), "sockperf-server.out", "")
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	// UDP has nothing to connect to: a bound socket is ready, datagrams
	// queue in it. A TCP sockperf server shrugs off a probe connection.
	if err := sp.waitReady(ctx, readiness{proto: proto, addr: srv.Addr, port: port, connect: proto == "tcp", cliNS: cli.NetNS}); err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}

	if w.Paced {
		return w.runPaced(ctx, s, srv, cli, p, port, sp)
	}
	fullLog := s.path("sockperf-full.csv")
	args := sockperfClientArgs("pp", common, p, cli, "--full-log", fullLog)
	out, err := s.runClient(ctx, cli, p.Duration, "sockperf-client", toolSockperf, args, sp)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	sum, err := parseSockperf(string(out))
	if err == nil {
		err = sum.stalled(p.Rate)
	}
	if err != nil {
		// The client exited cleanly without a summary: what it did print
		// (stdout and stderr) says why.
		client := logFile{"sockperf-client", s.path("sockperf-client.out")}
		clientErr := logFile{"sockperf-client stderr", s.path("sockperf-client.err")}
		return Result{}, withTail(fmt.Errorf("%s: %w", w.Name(), err), client, clientErr, sp)
	}
	var samples []float64
	if f, err := os.Open(fullLog); err == nil {
		samples, err = parseSockperfFullLog(f)
		f.Close()
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
		}
	}
	return sum.result(proto, samples), nil
}

// sockperfClientArgs is a sockperf client's command line: the mode (pp,
// tp), the server's address and port (common), the duration, the mode's
// own options (extra), then the point's message size and rate and the
// client's address where given.
func sockperfClientArgs(mode string, common []string, p Point, cli Endpoint, extra ...string) []string {
	args := append(append([]string{mode}, common...), "-t", itoa(wholeSeconds(p.Duration)))
	args = append(args, extra...)
	if p.MsgSize > 0 {
		args = append(args, "-m", itoa(p.MsgSize))
	}
	if p.Rate > 0 {
		args = append(args, "--mps", itoa(p.Rate))
	}
	if cli.Addr.IsValid() {
		args = append(args, "--client_ip", cli.Addr.String())
	}
	return args
}

// sockperfSummary is what sockperf's client prints for one server.
type sockperfSummary struct {
	RunTimeS             float64 // the valid (measured) duration, after warm-up
	Sent, Received       uint64
	AvgUs, StdDevUs      float64
	MinUs, MaxUs         float64
	Observations         uint64
	Dropped, Duplicated  uint64
	OutOfOrder           uint64
	Percentiles          map[string]float64 // "99.900" -> µs, keys as printed
	hasMin, hasMax, hasN bool
}

var (
	spValidRE = regexp.MustCompile(`\[Valid Duration\]\s*RunTime=([0-9.]+)\s*sec;\s*SentMessages=(\d+);\s*ReceivedMessages=(\d+)`)
	// avg-rtt when run with --full-rtt.
	spAvgRE   = regexp.MustCompile(`avg-(?:latency|rtt)=([0-9.]+)\s*\(std-dev=([0-9.]+)\)`)
	spDropRE  = regexp.MustCompile(`#\s*dropped messages\s*=\s*(\d+);\s*#\s*duplicated messages\s*=\s*(\d+);\s*#\s*out-of-order messages\s*=\s*(\d+)`)
	spTotalRE = regexp.MustCompile(`Total\s+(\d+)\s+observations`)
	// The whole run, warm-up included: printed even when nothing was measured.
	spTotalRunRE = regexp.MustCompile(`\[Total Run\]\s*RunTime=([0-9.]+)\s*sec;.*SentMessages=(\d+);\s*ReceivedMessages=(\d+)`)
	spObsRE      = regexp.MustCompile(`--->\s*<(MAX|MIN)>\s*observation\s*=\s*([0-9.]+)`)
	spPctRE      = regexp.MustCompile(`--->\s*percentile\s+([0-9.]+)\s*=\s*([0-9.]+)`)
)

// parseSockperf reads the client's summary. Escapes (sockperf colours some
// lines even into a file) are stripped first; lines are matched one by
// one, so reordering or extra lines do not matter.
func parseSockperf(text string) (*sockperfSummary, error) {
	text = stripANSI(text)
	if strings.Contains(text, "No messages were received") {
		return nil, fmt.Errorf("sockperf: no messages were received from the server")
	}
	s := &sockperfSummary{Percentiles: map[string]float64{}}
	var haveValid, haveAvg bool
	for _, ln := range strings.Split(text, "\n") {
		if m := spValidRE.FindStringSubmatch(ln); m != nil {
			s.RunTimeS = atof(m[1])
			s.Sent = atou(m[2])
			s.Received = atou(m[3])
			haveValid = true
		} else if m := spAvgRE.FindStringSubmatch(ln); m != nil {
			s.AvgUs, s.StdDevUs = atof(m[1]), atof(m[2])
			haveAvg = true
		} else if m := spDropRE.FindStringSubmatch(ln); m != nil {
			s.Dropped, s.Duplicated, s.OutOfOrder = atou(m[1]), atou(m[2]), atou(m[3])
		} else if m := spTotalRE.FindStringSubmatch(ln); m != nil {
			s.Observations, s.hasN = atou(m[1]), true
		} else if m := spObsRE.FindStringSubmatch(ln); m != nil {
			if m[1] == "MAX" {
				s.MaxUs, s.hasMax = atof(m[2]), true
			} else {
				s.MinUs, s.hasMin = atof(m[2]), true
			}
		} else if m := spPctRE.FindStringSubmatch(ln); m != nil {
			s.Percentiles[normPct(m[1])] = atof(m[2])
		}
	}
	if !haveValid || !haveAvg {
		// Ping-pong sends the next message only after the reply to the
		// last one, and never resends: one lost message or reply stops
		// the test, and sockperf then has nothing to report.
		if m := spTotalRunRE.FindStringSubmatch(text); m != nil && atou(m[2]) > atou(m[3]) {
			return nil, fmt.Errorf("sockperf ping-pong stalled: a message or its reply was lost (sent %s, %s replies in %s s; ping-pong never resends): %w",
				m[2], m[3], m[1], errNoResult)
		}
		return nil, fmt.Errorf("sockperf summary (avg-latency, [Valid Duration]): %w", errNoResult)
	}
	return s, nil
}

// stalled says whether a ping-pong paced at rate messages/s stopped part of
// the way through its measured time: one lost message or reply stops it
// (it never resends), and sockperf then reports the messages before the
// loss as if they were the whole run. Under background such runs occur,
// and their percentiles then describe their first second or two only. A
// paced ping-pong keeps its rate while
// its round trips are shorter than the interval; under 80% of it is a
// stall. Unpaced (rate 0) runs have no expected count.
func (s *sockperfSummary) stalled(rate int) error {
	if rate <= 0 || s.RunTimeS <= 0 {
		return nil
	}
	want := float64(rate) * s.RunTimeS
	if float64(s.Sent) >= 0.8*want {
		return nil
	}
	return fmt.Errorf("sockperf ping-pong stalled: a message or its reply was lost part of the way through (%d messages in the %.3f s measured, about %.0f at %d/s; ping-pong never resends): %w",
		s.Sent, s.RunTimeS, want, rate, errNoResult)
}

// normPct canonicalises a percentile label: "99.900" and "99.9" -> "99.9".
func normPct(s string) string {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return s
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// pct returns a percentile from the summary, else from the samples.
func (s *sockperfSummary) pct(p float64, sorted []float64) float64 {
	if v, ok := s.Percentiles[strconv.FormatFloat(p, 'f', -1, 64)]; ok {
		return v
	}
	return quantileSorted(sorted, p/100)
}

// result builds the Result; samples (may be nil) are the full log's
// per-message latencies, for the CDF and any percentile the summary lacks.
func (s *sockperfSummary) result(proto string, samples []float64) Result {
	cdf := cdfFromSamples(samples) // sorts samples
	r := Result{
		LatAvgUs:  s.AvgUs,
		LatMinUs:  s.MinUs,
		LatP50Us:  s.pct(50, samples),
		LatP99Us:  s.pct(99, samples),
		LatP999Us: s.pct(99.9, samples),
		LatCDF:    cdf,
		Extra: map[string]float64{
			"std_dev_us":   s.StdDevUs,
			"dropped":      float64(s.Dropped),
			"duplicated":   float64(s.Duplicated),
			"out_of_order": float64(s.OutOfOrder),
			"sent":         float64(s.Sent),
			"received":     float64(s.Received),
		},
	}
	if !s.hasMin && len(samples) > 0 {
		r.LatMinUs = samples[0]
	}
	if s.hasMax {
		r.Extra["max_us"] = s.MaxUs
	} else if len(samples) > 0 {
		r.Extra["max_us"] = samples[len(samples)-1]
	}
	if s.hasN {
		r.Extra["observations"] = float64(s.Observations)
	}
	for _, p := range []float64{25, 75, 90, 99.99, 99.999} {
		k := strconv.FormatFloat(p, 'f', -1, 64)
		if v, ok := s.Percentiles[k]; ok {
			r.Extra["p"+k+"_us"] = v
		}
	}
	// Round trips completed per second in the measured window.
	if s.RunTimeS > 0 {
		r.PPS = float64(s.Received) / s.RunTimeS
	}
	if proto == "udp" {
		r.UDPReorder = s.OutOfOrder
	}
	return r
}

// parseSockperfFullLog reads the per-message latencies (µs, RTT/2) from a
// --full-log file: a copy of the summary, then a CSV table
// "packet, txTime(sec), rxTime(sec), latency(usec)" up to a dashed line.
// Rows without a receive time (lost replies) are skipped.
func parseSockperfFullLog(r io.Reader) ([]float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var out []float64
	inTable := false
	for sc.Scan() {
		ln := strings.TrimSpace(sc.Text())
		if !inTable {
			inTable = strings.HasPrefix(ln, "packet,") && strings.Contains(ln, "latency")
			continue
		}
		if strings.HasPrefix(ln, "---") {
			break
		}
		f := strings.Split(ln, ",")
		if len(f) != 4 {
			continue
		}
		rx, err1 := strconv.ParseFloat(strings.TrimSpace(f[2]), 64)
		lat, err2 := strconv.ParseFloat(strings.TrimSpace(f[3]), 64)
		if err1 != nil || err2 != nil || rx == 0 || lat < 0 {
			continue
		}
		out = append(out, lat)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading sockperf full log: %w", err)
	}
	return out, nil
}

func atof(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

func atou(s string) uint64 {
	u, _ := strconv.ParseUint(s, 10, 64)
	return u
}
