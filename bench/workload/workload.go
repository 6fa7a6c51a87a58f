// Package workload drives the field's real tools (iperf3, sockperf,
// memcached + memaslap, nginx + wrk) between two endpoints in network
// namespaces and returns what the receiving application got.
//
// A workload knows nothing about modes or testbeds: the benchmark runner
// hands it two endpoints and a point (message size, flows, duration).
package workload

import (
	"context"
	"net/netip"
	"time"

	"github.com/lanesnet/lanes/bench/results"
)

// Endpoint is one side of a workload.
type Endpoint struct {
	NetNS string     // named network namespace ("" = current)
	Addr  netip.Addr // address the server listens on / the client binds
	// CPUs the process is pinned to (nil = no pinning).
	CPUs []int
	// idle starts the process at SCHED_IDLE (SockperfThroughput.Idle).
	idle bool
}

// Point is what to measure.
type Point struct {
	Proto    string // "tcp" or "udp" where the workload offers both
	MsgSize  int    // application message size in bytes
	Flows    int    // parallel connections/streams (>= 1)
	Duration time.Duration
	// Rate, when > 0, is the offered message rate (messages/s) for tools
	// that can pace (sockperf --mps, wrk2-style); 0 = as fast as possible.
	Rate int
	// Port is the base port; workloads use Port..Port+Flows-1.
	Port int
}

// Result is what a workload measured; the runner copies it into a
// results.Run and adds the host-side metrics.
type Result struct {
	ThroughputGbps float64
	PPS            float64
	SentPPS        float64
	LatAvgUs       float64
	LatMinUs       float64
	LatP50Us       float64
	LatP99Us       float64
	LatP999Us      float64
	LatCDF         []results.CDFPoint
	UDPReorder     uint64
	Extra          map[string]float64
}

// Workload is one tool-driven measurement.
type Workload interface {
	Name() string
	// Run starts the server in srv's namespace, runs the client from cli's,
	// waits for both and returns what the receiving side measured. It
	// kills everything it started before returning, also on ctx cancel.
	Run(ctx context.Context, srv, cli Endpoint, p Point) (Result, error)
}
