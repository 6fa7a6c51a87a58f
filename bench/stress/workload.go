package stress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/lanesnet/lanes/bench/workload"
)

// NewUDPStress returns the udp_stress workload: the generator injects
// VXLAN frames at the sending host's underlay device (Target) and a Sink in
// the receiving container counts what the overlay delivered. With a Plain
// target the frames are plain UDP and srv is the receiving host itself
// (its underlay address, t.DstIP): the native path.
//
// From the workload's arguments: srv is the receiving container (the sink
// binds srv.Addr:p.Port in srv.NetNS, reading on srv.CPUs; srv.Addr is the
// inner destination unless t.InnerDstIP is set); cli.Addr is the inner
// source unless t.InnerSrcIP is set (cli's namespace is not used: frames
// start below the sending container). p.MsgSize, p.Flows and p.Rate
// override gen's PayloadSize, Flows and Rate when non-zero; every flow
// goes to the one port p.Port (flows differ by source port), not to
// p.Port..p.Port+Flows-1.
func NewUDPStress(t Target, gen GenConfig) workload.Workload {
	return &udpStress{t: t, gen: gen}
}

type udpStress struct {
	t   Target
	gen GenConfig
}

func (*udpStress) Name() string { return "udp_stress" }

// drainQuiet is how long the sink must see nothing before the run counts
// as drained; drainMax bounds the wait when something keeps trickling in.
const (
	drainQuiet = 100 * time.Millisecond
	drainMax   = 2 * time.Second
)

func (u *udpStress) Run(ctx context.Context, srv, cli workload.Endpoint, p workload.Point) (workload.Result, error) {
	t, gen := u.t, u.gen
	if !t.InnerDstIP.IsValid() {
		t.InnerDstIP = srv.Addr
	}
	if !t.InnerSrcIP.IsValid() {
		t.InnerSrcIP = cli.Addr
	}
	if p.MsgSize > 0 {
		gen.PayloadSize = p.MsgSize
	}
	if p.Flows > 0 {
		gen.Flows = p.Flows
	}
	if p.Rate > 0 {
		gen.Rate = float64(p.Rate)
	}
	if p.Port > 0 {
		gen.DstPort = uint16(p.Port)
	}
	gen = gen.withDefaults()
	if p.Duration <= 0 {
		return workload.Result{}, errors.New("udp_stress needs a duration")
	}

	g, err := NewGenerator(t, gen)
	if err != nil {
		return workload.Result{}, err
	}
	defer g.Close()

	sink := &Sink{NetNS: srv.NetNS, Addr: netip.AddrPortFrom(srv.Addr, gen.DstPort), CPUs: srv.CPUs}
	if err := sink.Start(); err != nil {
		return workload.Result{}, err
	}
	defer sink.Stop()

	gs, err := g.Run(ctx, p.Duration)
	if err != nil {
		return workload.Result{}, err
	}
	waitDrained(ctx, sink)
	ss := sink.Stop()
	if ss.Err != nil {
		return workload.Result{}, ss.Err
	}
	if gs.Sent > 0 && ss.Datagrams == 0 {
		return workload.Result{}, fmt.Errorf("udp_stress: sent %d frames into %s but the sink at %v got none: "+
			"check the receiving underlay veth runs NAPI (GRO on or an XDP program attached) and the target's MACs, IPs and VNI",
			gs.Sent, t.SenderDev, sink.Addr)
	}

	// Rates are over the generator's active time; the datagrams still in
	// flight when it stopped (rings plus the socket queue, drained above)
	// are counted, which can overstate a saturated receiver by at most a
	// socket buffer's worth over the whole run.
	secs := gs.Elapsed.Seconds()
	return workload.Result{
		ThroughputGbps: float64(ss.Bytes) * 8 / secs / 1e9,
		PPS:            float64(ss.Datagrams) / secs,
		SentPPS:        gs.PPS(),
		UDPReorder:     ss.Reorder,
		Extra: map[string]float64{
			"udp_sent":     float64(gs.Sent),
			"udp_received": float64(ss.Datagrams),
			"udp_lost":     float64(ss.Lost),
			"udp_flows":    float64(ss.Flows),
			"target_pps":   gen.Rate,
			// Non-zero: the pacer lost its core for longer than Burst
			// packets and SentPPS fell short of target_pps.
			"gen_stalls": float64(gs.Stalls),
			// Paced packets sent in catch-up bursts, more than one
			// interval behind schedule (the pacer's thread was held off
			// its core for less than Burst packets' worth).
			"gen_late": float64(gs.Late),
			// Datagrams per train of a paced run (1: evenly spaced or, for
			// an unpaced run, line-rate bursts the pacer does not shape).
			"train": float64(trainOf(gen)),
			// 1: a paced run's packets (trains) came at Poisson times.
			"poisson": float64(boolU8(gen.Rate > 0 && gen.Arrivals == ArrivalsPoisson)),
		},
	}, nil
}

// waitDrained returns once the sink has received nothing for drainQuiet.
func waitDrained(ctx context.Context, s *Sink) {
	deadline := time.Now().Add(drainMax)
	last := s.Received()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(drainQuiet)
		n := s.Received()
		if n == last {
			return
		}
		last = n
	}
}

// trainOf is the train length a run was offered in: unpaced runs ignore it.
func trainOf(c GenConfig) int {
	if c.Rate == 0 {
		return 1
	}
	return c.Train
}
