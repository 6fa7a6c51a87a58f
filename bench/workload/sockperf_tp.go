package workload

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// SockperfThroughput offers UDP datagrams at a paced rate with sockperf's
// throughput mode, as PRISM's evaluation generated its low-priority
// background, and counts what its server received.
//
// Server: sockperf sr -i <srv addr> -p <port>
// Client: sockperf tp -i <srv addr> -p <port> -t <secs> [--burst <n>]
//
//	[-m <msg size>] --mps <rate> [--client_ip <cli addr>]
//
// Unlike the stress generator, whose frames enter the sending host's
// underlay ready-made, sockperf's datagrams go down the sender's whole
// stack (container socket, veth, bridge, VXLAN), so they leave it spaced
// as a real sender's do. The client sleeps until its next message (or
// burst) is due (in hrtimer_nanosleep); Idle runs it at SCHED_IDLE
// so that it sends with what the other tasks of its cores leave, as the
// stress generator does. It sends nothing for its first
// SockperfTPStart.
type SockperfThroughput struct {
	// Burst sends this many messages back to back every 1/(rate/Burst)
	// s (sockperf --burst): trains at the same average rate. 0 or 1: one
	// message at a time.
	Burst int
	// Idle runs the client at SCHED_IDLE.
	Idle bool
}

func (SockperfThroughput) Name() string { return "sockperf_tp" }

// SockperfTPStart is how long sockperf's client waits after it starts
// before its first message: sockperf 3.7 sleeps 2 s before it sends
// (client.cpp; a run of `-t 1` lasts over 3 s), whatever its options. Its -t
// counts from the end of that wait. Whoever needs the load running must
// wait this long after Run starts, plus its own margin.
const SockperfTPStart = 2 * time.Second

// spServerStop is how long the server gets to print its count after
// SIGINT before it is killed.
const spServerStop = 3 * time.Second

func (w SockperfThroughput) Run(ctx context.Context, srv, cli Endpoint, p Point) (Result, error) {
	srv, cli = unmapped(srv), unmapped(cli)
	if err := checkEndpoints(w.Name(), srv, cli); err != nil {
		return Result{}, err
	}
	if p.Proto != "" && strings.ToLower(p.Proto) != "udp" {
		return Result{}, fmt.Errorf("%s: proto %q: sockperf's throughput mode is run with UDP here", w.Name(), p.Proto)
	}
	if p.Rate <= 0 {
		return Result{}, fmt.Errorf("%s: needs a rate (messages/s), got %d", w.Name(), p.Rate)
	}
	if w.Burst < 0 || w.Burst > p.Rate {
		return Result{}, fmt.Errorf("%s: burst %d: want 0..%d (the rate)", w.Name(), w.Burst, p.Rate)
	}
	s, err := newSession(w.Name())
	if err != nil {
		return Result{}, err
	}
	defer s.close()

	port := portOr(p, defaultSockperfPort)
	common := []string{"-i", srv.Addr.String(), "-p", itoa(port)}
	sp, err := s.start(srv, "sockperf-tp-server", toolSockperf, append([]string{"sr"}, common...), "sockperf-tp-server.out", "")
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	if err := sp.waitReady(ctx, readiness{proto: "udp", addr: srv.Addr, port: port, cliNS: cli.NetNS}); err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	var burst []string
	if w.Burst > 1 {
		burst = []string{"--burst", itoa(w.Burst)}
	}
	args := sockperfClientArgs("tp", common, p, cli, burst...)
	c := cli
	c.idle = w.Idle
	out, err := s.runClient(ctx, c, p.Duration, "sockperf-tp-client", toolSockperf, args, sp)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	sent, secs, err := parseSockperfTPClient(string(out))
	if err != nil {
		client := logFile{"sockperf-tp-client", s.path("sockperf-tp-client.out")}
		return Result{}, withTail(fmt.Errorf("%s: %w", w.Name(), err), client, sp)
	}
	// The server prints its count when interrupted. Datagrams still in
	// flight when the client ends arrive within microseconds; give them
	// a moment before asking.
	time.Sleep(50 * time.Millisecond)
	if !sp.running() {
		return Result{}, withTail(fmt.Errorf("%s: sockperf-tp-server exited during the run (its output is below)", w.Name()), sp)
	}
	if err := sp.interrupt(spServerStop); err != nil {
		return Result{}, withTail(fmt.Errorf("%s: %w", w.Name(), err), sp)
	}
	text, _ := os.ReadFile(sp.outPath)
	received, err := parseSockperfTPServer(string(text))
	if err != nil {
		return Result{}, withTail(fmt.Errorf("%s: %w", w.Name(), err), sp)
	}
	lost := float64(0)
	if sent > received {
		lost = float64(sent - received)
	}
	return Result{
		SentPPS: float64(sent) / secs,
		// The server counts from its start to the interrupt; the client's
		// seconds are the window the datagrams were sent in.
		PPS: float64(received) / secs,
		Extra: map[string]float64{
			"udp_sent":     float64(sent),
			"udp_received": float64(received),
			"udp_lost":     lost,
		},
	}, nil
}

var (
	spTPSentRE = regexp.MustCompile(`Total of (\d+) messages sent in ([0-9.]+) sec`)
	spTPRecvRE = regexp.MustCompile(`Total (\d+) messages received`)
)

// parseSockperfTPClient reads how many messages sockperf's throughput
// client sent, and in how many seconds.
func parseSockperfTPClient(text string) (sent uint64, secs float64, err error) {
	m := spTPSentRE.FindStringSubmatch(stripANSI(text))
	if m == nil {
		return 0, 0, fmt.Errorf("sockperf throughput summary (Total of N messages sent): %w", errNoResult)
	}
	sent, secs = atou(m[1]), atof(m[2])
	if secs <= 0 {
		return 0, 0, fmt.Errorf("sockperf throughput client: sent %d messages in %s s: %w", sent, m[2], errNoResult)
	}
	return sent, secs, nil
}

// parseSockperfTPServer reads how many messages sockperf's server got, as
// it prints on SIGINT.
func parseSockperfTPServer(text string) (uint64, error) {
	text = stripANSI(text)
	m := spTPRecvRE.FindStringSubmatch(text)
	if m == nil && strings.Contains(text, "No messages were received") {
		// What the server prints instead when nothing came (server.cpp):
		// every datagram lost is a result, not a failure.
		return 0, nil
	}
	if m == nil {
		return 0, fmt.Errorf("sockperf server's count (Total N messages received) after SIGINT: %w", errNoResult)
	}
	return atou(m[1]), nil
}
