package workload

import (
	"context"
	"encoding/json"
	"fmt"
)

// Iperf3 drives iperf3 for tcp_stream, udp_stream and tcp_multi.
//
// Server: iperf3 -s -1 -J -B <srv addr> -p <port>
// Client: iperf3 -c <srv addr> -p <port> -t <secs> -J [-B <cli addr>]
//
//	[-l <msg size>] [-u -b 0] [-P <flows>] [-b <rate*size*8>]
//
// Numbers come from the client's JSON, whose end.sum_received is what the
// server (the receiver) counted: iperf3 ships the server's results back to
// the client at the end of the test.
type Iperf3 struct {
	// WorkloadName is what Name returns: tcp_stream, udp_stream or tcp_multi.
	WorkloadName string
	UDP          bool
	// Multi uses Point.Flows parallel streams (-P); otherwise one stream.
	Multi bool
}

// maxUDPPayload is the largest UDP payload over IPv4 (65535 - 8 - 20).
const maxUDPPayload = 65507

const defaultIperfPort = 5201

func (w Iperf3) Name() string { return w.WorkloadName }

func (w Iperf3) Run(ctx context.Context, srv, cli Endpoint, p Point) (Result, error) {
	srv, cli = unmapped(srv), unmapped(cli)
	if err := checkEndpoints(w.Name(), srv, cli); err != nil {
		return Result{}, err
	}
	s, err := newSession(w.Name())
	if err != nil {
		return Result{}, err
	}
	defer s.close()

	port := portOr(p, defaultIperfPort)
	addr := srv.Addr.String()
	// -J on the server too: it then prints nothing until the end, so the
	// receiver spends no cycles writing per-second reports mid-test.
	sp, err := s.start(srv, "iperf3-server", toolIperf3,
		[]string{"-s", "-1", "-J", "-B", addr, "-p", itoa(port)}, "iperf3-server.out", "")
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	// No connect probe: iperf3 -s -1 would take a bare connection as its
	// one test and exit. A listening socket is the readiness condition.
	if err := sp.waitReady(ctx, readiness{proto: "tcp", addr: srv.Addr, port: port}); err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}

	args := []string{"-c", addr, "-p", itoa(port), "-t", itoa(wholeSeconds(p.Duration)), "-J"}
	if cli.Addr.IsValid() {
		args = append(args, "-B", cli.Addr.String())
	}
	size := p.MsgSize
	if w.UDP && size > maxUDPPayload {
		size = maxUDPPayload
	}
	if size > 0 {
		args = append(args, "-l", itoa(size))
	}
	flows := 1
	if w.Multi && p.Flows > 1 {
		flows = p.Flows
	}
	if flows > 1 {
		args = append(args, "-P", itoa(flows))
	}
	switch {
	case p.Rate > 0 && size > 0:
		// Pace to Rate messages/s per stream (iperf3 paces bits/s).
		args = append(args, "-b", fmt.Sprint(int64(p.Rate)*int64(size)*8))
	case w.UDP:
		args = append(args, "-b", "0") // unlimited (UDP defaults to 1 Mbit/s)
	}
	if w.UDP {
		args = append(args, "-u")
	}
	out, cerr := s.runClient(ctx, cli, p.Duration, "iperf3-client", toolIperf3, args, sp)
	if cerr != nil {
		// iperf3 -J reports its own failure in the JSON; put that first.
		var o iperfOutput
		if json.Unmarshal(out, &o) == nil && o.Error != "" {
			return Result{}, fmt.Errorf("%s: iperf3: %s: %w", w.Name(), o.Error, cerr)
		}
		return Result{}, fmt.Errorf("%s: %w", w.Name(), cerr)
	}
	r, err := parseIperf3(out)
	if err != nil {
		return Result{}, withTail(fmt.Errorf("%s: %w", w.Name(), err), sp)
	}
	return r.result(w.UDP)
}

// iperfSum is one of end.sum / sum_sent / sum_received.
type iperfSum struct {
	Seconds       float64 `json:"seconds"`
	Bytes         float64 `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   uint64  `json:"retransmits"`
	// UDP only.
	JitterMs    float64 `json:"jitter_ms"`
	LostPackets int64   `json:"lost_packets"` // iperf3 nets late arrivals off this, it can dip below 0
	Packets     int64   `json:"packets"`
	LostPercent float64 `json:"lost_percent"`
}

// iperfOutput is the part of iperf3 -J output the drivers read.
type iperfOutput struct {
	Start struct {
		TestStart struct {
			Protocol   string `json:"protocol"`
			NumStreams int    `json:"num_streams"`
			Blksize    int    `json:"blksize"`
		} `json:"test_start"`
	} `json:"start"`
	End struct {
		Streams []struct {
			Sender *struct {
				Retransmits uint64  `json:"retransmits"`
				MeanRTT     float64 `json:"mean_rtt"` // µs
			} `json:"sender"`
			UDP *struct {
				OutOfOrder uint64 `json:"out_of_order"`
			} `json:"udp"`
		} `json:"streams"`
		SumSent     *iperfSum `json:"sum_sent"`
		SumReceived *iperfSum `json:"sum_received"`
		CPU         *struct {
			HostTotal   float64 `json:"host_total"`
			RemoteTotal float64 `json:"remote_total"`
		} `json:"cpu_utilization_percent"`
	} `json:"end"`
	Error string `json:"error"`
}

// parseIperf3 decodes iperf3 -J output. A JSON "error" is returned as an
// error starting with "iperf3:" and a nil result.
func parseIperf3(b []byte) (*iperfOutput, error) {
	var o iperfOutput
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("parsing iperf3 JSON: %w", err)
	}
	if o.Error != "" {
		return nil, fmt.Errorf("iperf3: %s", o.Error)
	}
	if o.End.SumReceived == nil || o.End.SumSent == nil {
		return nil, fmt.Errorf("iperf3 JSON has no end.sum_received: %w", errNoResult)
	}
	return &o, nil
}

// result turns iperf3's report into a Result, receiver side.
func (o *iperfOutput) result(udp bool) (Result, error) {
	rx, tx := o.End.SumReceived, o.End.SumSent
	blk := float64(o.Start.TestStart.Blksize)
	if rx.Seconds <= 0 || blk <= 0 {
		return Result{}, fmt.Errorf("iperf3 reported %v s and block size %v: %w", rx.Seconds, blk, errNoResult)
	}
	r := Result{
		ThroughputGbps: rx.BitsPerSecond / 1e9,
		// Messages at the receiving application: for TCP the byte stream
		// divided into the sender's writes (-l), for UDP exactly the
		// datagrams received, since every datagram is one block.
		PPS:   rx.Bytes / blk / rx.Seconds,
		Extra: map[string]float64{},
	}
	r.Extra["sender_gbps"] = tx.BitsPerSecond / 1e9
	r.Extra["block_size"] = blk
	r.Extra["streams"] = float64(len(o.End.Streams))
	if c := o.End.CPU; c != nil {
		r.Extra["client_cpu_pct"] = c.HostTotal
		r.Extra["server_cpu_pct"] = c.RemoteTotal
	}
	if udp {
		var ooo uint64
		for _, s := range o.End.Streams {
			if s.UDP != nil {
				ooo += s.UDP.OutOfOrder
			}
		}
		r.UDPReorder = ooo
		if tx.Seconds > 0 {
			r.SentPPS = float64(tx.Packets) / tx.Seconds
		}
		r.Extra["lost_packets"] = float64(rx.LostPackets)
		r.Extra["lost_pct"] = rx.LostPercent
		r.Extra["jitter_ms"] = rx.JitterMs
		r.Extra["sent_packets"] = float64(tx.Packets)
		r.Extra["received_packets"] = rx.Bytes / blk
		return r, nil
	}
	r.Extra["retransmits"] = float64(tx.Retransmits)
	var rtt float64
	var n int
	for _, s := range o.End.Streams {
		if s.Sender != nil && s.Sender.MeanRTT > 0 {
			rtt += s.Sender.MeanRTT
			n++
		}
	}
	if n > 0 {
		r.Extra["mean_rtt_us"] = rtt / float64(n)
	}
	return r, nil
}
