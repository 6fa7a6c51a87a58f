// Package results is the schema of a benchmark run: what `lanes bench`
// writes to results.json and what the report and the plots read back.
//
// One Run is one measurement: one mode, one workload point (message size,
// flows, background load), one repeat. Aggregation (median, min-max, ratios)
// happens when reading, never when writing, so nothing measured is lost.
package results

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// File is the top-level object of results.json.
type File struct {
	Machine Machine   `json:"machine"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
	// Args is the command line the run was made with, to repeat it.
	Args     []string `json:"args"`
	Quick    bool     `json:"quick"`
	Repeats  int      `json:"repeats"`
	Modes    []string `json:"modes"`
	Duration float64  `json:"duration_s"` // seconds each measurement ran
	Runs     []Run    `json:"runs"`
	// Notes are things the run wants a reader to know (a mode that degraded,
	// a workload that was skipped and why).
	Notes []string `json:"notes,omitempty"`
}

// Machine says where the numbers came from.
type Machine struct {
	Hostname string `json:"hostname"`
	Kernel   string `json:"kernel"`
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
	MemGiB   int    `json:"mem_gib"`
	Topology string `json:"topology"` // testbed topology: docker, flannel or calico
	// Overlay names the daemons that built the overlay (flanneld,
	// dockerd); empty when lanes' testbed built it.
	Overlay string `json:"overlay,omitempty"`
	IRQCPU  int    `json:"irq_cpu"` // core that polls the receiving underlay NIC
	// SenderPollCPU polls the sending host's underlay NIC: IRQCPU unless
	// the run had --sender-apart (nil in files from before it existed).
	SenderPollCPU *int `json:"sender_poll_cpu,omitempty"`
	// NIC is how the testbed polled its underlay NICs: "threaded" or
	// "softirq" ("" in files from before it existed: threaded).
	NIC      string `json:"nic,omitempty"`
	GoVer    string `json:"go_version"`
	LanesVer string `json:"lanes_version"`
}

// Run is one measurement.
type Run struct {
	Mode     string `json:"mode"`     // native, vanilla, rps, ...
	Workload string `json:"workload"` // tcp_stream, udp_stream, tcp_multi, pingpong, udp_stress, memcached, nginx
	Proto    string `json:"proto,omitempty"`
	MsgSize  int    `json:"msg_size"` // bytes per application message; 0 when not applicable
	Flows    int    `json:"flows"`
	// Background is the low-priority load the run ran under, as a fraction
	// of the receive core (0 = idle). Used by priority workloads.
	Background float64 `json:"background"`
	// Rate is the offered rate the generator was paced at, packets/s (0 =
	// as fast as it can). Used by udp_stress's paced points (--rates).
	Rate int `json:"rate,omitempty"`
	// Awake says the machine's cores were kept out of idle states for
	// the run (a zero CPU latency request, /dev/cpu_dma_latency): a
	// priority workload's baseline where an idle core means no competing
	// packets, not a sleeping core that first has to wake.
	Awake  bool   `json:"awake,omitempty"`
	Repeat int    `json:"repeat"` // 0-based repeat index
	Error  string `json:"error,omitempty"`

	// Throughput at the receiving application.
	ThroughputGbps float64 `json:"throughput_gbps"`
	PPS            float64 `json:"pps"` // messages (datagrams, requests) per second at the receiving application
	// SentPPS is the offered rate where the workload knows it (udp_stress).
	SentPPS float64 `json:"sent_pps,omitempty"`

	// Latency, microseconds; zero when the workload measures none.
	LatAvgUs  float64 `json:"lat_avg_us"`
	LatP50Us  float64 `json:"lat_p50_us"`
	LatP99Us  float64 `json:"lat_p99_us"`
	LatP999Us float64 `json:"lat_p999_us"`
	LatMinUs  float64 `json:"lat_min_us"`
	// LatCDF is a thinned latency distribution (for CDF plots).
	LatCDF []CDFPoint `json:"lat_cdf,omitempty"`

	// CPU is the receiving host's per-CPU time split over the run.
	CPU []CPUUse `json:"cpu"`

	// Counters, deltas over the run, on the receiving side.
	Retrans      uint64 `json:"retrans"`       // TcpRetransSegs (sender side: retransmits happen there)
	OFO          uint64 `json:"ofo"`           // TcpExtTCPOFOQueue: segments queued out of order
	DSACK        uint64 `json:"dsack"`         // TcpExtTCPDSACKRecv + TCPDSACKOfoRecv at the sender
	UDPReorder   uint64 `json:"udp_reorder"`   // datagrams received with a lower sequence number than one already seen
	DropsSoftnet uint64 `json:"drops_softnet"` // /proc/net/softnet_stat dropped
	DropsSocket  uint64 `json:"drops_socket"`  // UdpRcvbufErrors + UdpInErrors + TcpExtTCPBacklogDrop ...
	DropsNIC     uint64 `json:"drops_nic"`     // rx_dropped of the receiving underlay device

	// Extra holds workload-specific values (e.g. memcached gets/s) so the
	// schema does not grow a field per tool.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// CDFPoint is one point of a latency CDF.
type CDFPoint struct {
	Us       float64 `json:"us"`
	Fraction float64 `json:"p"`
}

// CPUUse is one CPU's time split over a run, in percent of wall time.
type CPUUse struct {
	CPU     int     `json:"cpu"`
	SoftIRQ float64 `json:"softirq"`
	System  float64 `json:"system"` // includes irq
	User    float64 `json:"user"`   // includes nice
	Idle    float64 `json:"idle"`   // includes iowait
	NetRX   uint64  `json:"net_rx"` // NET_RX softirqs raised on this CPU
	// Kthreads is the CPU time (percent) of NAPI/cpumap kthreads that ran
	// on this CPU: threaded NAPI runs outside softirq accounting.
	Kthreads float64 `json:"kthreads"`
}

// Write saves f as indented JSON.
func (f *File) Write(path string) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Read loads a results.json.
func Read(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	return &f, nil
}
