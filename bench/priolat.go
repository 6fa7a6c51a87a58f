package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lanesnet/lanes/bench/stress"
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/datapath/steer"
)

// PRISM's micro-benchmark (its Fig. 9 and 11): a high-priority sockperf
// UDP ping-pong at 1000 messages/s between the containers, while the stress
// generator offers low-priority UDP to the same receiving container at a
// fraction of what the receive core can take (point.background). The
// ping-pong's latency is the result; the background's received rate is the
// low-priority throughput, which must not collapse.
const (
	prioLatencyWorkload = "prio_latency"
	prioPingRate        = 1000 // messages/s, as in the paper
	prioPingSize        = 64
	// prioLead starts the background this long before the ping-pong, and
	// it runs this much longer, so every ping sees it.
	prioLead = 700 * time.Millisecond
)

// prioBackgrounds are the background loads measured, as fractions of the
// receive core's capacity: idle, the paper's 60-70%, and (full runs) its
// sweep of Fig. 11.
func prioBackgrounds(quick bool) []float64 {
	if quick {
		return []float64{0, 0.65}
	}
	return []float64{0, 0.3, 0.65, 0.9}
}

type prioLatency struct {
	target stress.Target
	gen    stress.GenConfig
	// rate is the background's offered rate (packets/s); 0 = idle.
	rate float64
}

func (*prioLatency) Name() string { return prioLatencyWorkload }

func (w *prioLatency) Run(ctx context.Context, srv, cli workload.Endpoint, p workload.Point) (workload.Result, error) {
	type bgResult struct {
		res workload.Result
		err error
	}
	bg := make(chan bgResult, 1)
	if w.rate > 0 {
		g := w.gen
		g.Rate = w.rate
		bgp := workload.Point{MsgSize: prioPingSize, Flows: 1, Duration: p.Duration + 2*prioLead, Port: p.Port + 8}
		// The background's receiver reads on the generator's core, as
		// the paper ran it on a core of its own: the receive core is for
		// the receive path and the high-priority server.
		bgSrv := srv
		bgSrv.CPUs = []int{g.CPU}
		go func() {
			r, err := stress.NewUDPStress(w.target, g).Run(ctx, bgSrv, cli, bgp)
			bg <- bgResult{r, err}
		}()
		select {
		case <-time.After(prioLead):
		case <-ctx.Done():
			return workload.Result{}, ctx.Err()
		}
	} else {
		bg <- bgResult{}
	}
	ping, perr := workload.PingPong{}.Run(ctx, srv, cli, workload.Point{Proto: "udp", MsgSize: prioPingSize, Duration: p.Duration, Rate: prioPingRate, Port: p.Port})
	b := <-bg
	if perr != nil {
		return workload.Result{}, perr
	}
	if b.err != nil {
		return workload.Result{}, fmt.Errorf("background: %w", b.err)
	}
	if ping.Extra == nil {
		ping.Extra = map[string]float64{}
	}
	ping.Extra["bg_offered_kpps"] = b.res.SentPPS / 1e3
	ping.Extra["bg_received_kpps"] = b.res.PPS / 1e3
	ping.UDPReorder = b.res.UDPReorder
	return ping, nil
}

// prioRule marks a point's high-priority flow (the ping-pong to the
// receiving container's port) in a prism mode, until the returned undo.
func (r *runner) prioRule(mode string, srv workload.Endpoint, port int) (func(), error) {
	base, _, _ := ParseModeSpec(mode)
	if !strings.HasPrefix(base, "prism") {
		return func() {}, nil
	}
	set, err := control.OpenPrio(r.tb.Receiver().NetNS)
	if err != nil {
		return nil, err
	}
	rule := steer.Rule{Addr: srv.Addr, Port: uint16(port), Proto: 17}
	if err := set.Add(rule); err != nil {
		set.Close()
		return nil, err
	}
	return func() {
		set.Del(rule)
		set.Close()
	}, nil
}

// calibrate measures what the receive core takes under vanilla (udp_stress
// at full rate), the 100% of prio_latency's background loads.
func (r *runner) calibrate(ctx context.Context) error {
	if err := r.apply("vanilla"); err != nil {
		return err
	}
	srv, cli, err := r.endpoints("vanilla", point{workload: "udp_stress"})
	if err != nil {
		return err
	}
	d := min(r.o.Duration, 3*time.Second)
	res, err := stress.NewUDPStress(r.stressTarget(), r.stressGen()).Run(ctx, srv, cli, workload.Point{MsgSize: prioPingSize, Flows: 1, Duration: d, Port: r.port()})
	if err != nil {
		return fmt.Errorf("calibrating the background: %w", err)
	}
	if res.PPS < 1000 {
		return fmt.Errorf("calibrating the background: the receive core took only %.0f packets/s", res.PPS)
	}
	r.capacity = res.PPS
	r.file.Notes = append(r.file.Notes, fmt.Sprintf("prio_latency: background 100%% = %.0f Kpps, what udp_stress delivered at full rate under vanilla (%v) at the start; the background is that share of it, offered by the stress generator to the same container (low priority), while sockperf ping-pong runs at %d msg/s (high priority in prism modes).",
		res.PPS/1e3, d, prioPingRate))
	fmt.Fprintf(r.o.Progress, "prio_latency: receive core capacity %.0f Kpps (vanilla, udp_stress)\n", res.PPS/1e3)
	return nil
}
