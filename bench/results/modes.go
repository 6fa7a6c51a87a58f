package results

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ParseModeSpec splits a benchmark mode "falcon:load=busy:threshold=70"
// into the lanes mode and its settings, so variants of one mode run side by
// side (each variant is recorded and reported under its full spec).
func ParseModeSpec(spec string) (mode string, params map[string]string, err error) {
	parts := strings.Split(spec, ":")
	mode = parts[0]
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", nil, fmt.Errorf("bad mode %q: settings are MODE:KEY=VALUE:KEY=VALUE, e.g. falcon:load=busy", spec)
		}
		if params == nil {
			params = map[string]string{}
		}
		params[k] = v
	}
	return mode, params, nil
}

// BatchVariant is one mode of a batch-size series: Mode is the full spec
// ("mflow:batch=64"), Base the mode without the batch setting.
type BatchVariant struct {
	Mode  string
	Base  string
	Batch int
}

// BatchSeries groups the modes of the form MODE:batch=N (MFLOW's micro-flow
// batch size) by base mode, each sorted by batch; a base mode is the spec
// with the batch setting taken out ("mflow", "mflow:cores=2"), so other
// settings make series of their own. Modes without a positive integer
// batch are not part of any series.
func (a *Agg) BatchSeries() (bases []string, series map[string][]BatchVariant) {
	series = map[string][]BatchVariant{}
	for _, m := range a.modes {
		v, ok := batchVariant(m)
		if !ok {
			continue
		}
		if _, seen := series[v.Base]; !seen {
			bases = append(bases, v.Base)
		}
		series[v.Base] = append(series[v.Base], v)
	}
	for _, b := range bases {
		slices.SortStableFunc(series[b], func(x, y BatchVariant) int { return x.Batch - y.Batch })
	}
	return bases, series
}

func batchVariant(spec string) (BatchVariant, bool) {
	parts := strings.Split(spec, ":")
	batch := 0
	rest := parts[:1]
	for _, kv := range parts[1:] {
		k, v, _ := strings.Cut(kv, "=")
		if k != "batch" {
			rest = append(rest, kv)
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return BatchVariant{}, false
		}
		batch = n
	}
	if batch == 0 {
		return BatchVariant{}, false
	}
	return BatchVariant{Mode: spec, Base: strings.Join(rest, ":"), Batch: batch}, true
}

// OrderMetrics are the reordering counters that say whether a workload's
// stream arrived in order (MFLOW's Fig. 7): the sink's or iperf3's
// out-of-order datagrams for UDP streams, out-of-order queueing and DSACKs
// for TCP ones. Nil for workloads that are not streams.
func OrderMetrics(workload string) []Metric {
	switch workload {
	case "udp_stress", "udp_stream":
		return []Metric{UDPReorder}
	case "tcp_stream", "tcp_multi":
		return []Metric{OFO, DSACK}
	}
	return nil
}
