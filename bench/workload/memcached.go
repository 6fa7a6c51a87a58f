package workload

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/bench/results"
)

// Memcached loads a memcached server with memaslap (Debian: memcaslap),
// 90% get / 10% set (memaslap's default mix) on fixed-size values.
//
// Server: memcached [-u root] -l <srv addr> -p <port> -U 0 -t <threads>
//
//	-m 1024 -c <max conns>
//
// Client: memcaslap -s <srv addr>:<port> -t <secs>s -T <threads>
//
//	-c <concurrency> -X <value size> -S <secs+3600>s
//
// -S beyond the run's end makes memaslap print its final latency
// statistics (with a log2 histogram) once, without periodic screen dumps.
type Memcached struct {
	// ServerThreads is memcached -t; 0 = one per server CPU, or 1.
	ServerThreads int
	// ClientThreads is memaslap -T; 0 = one per client CPU, or 1. Lowered
	// to a divisor of the concurrency, which memaslap requires.
	ClientThreads int
	// Concurrency is memaslap -c (connections); 0 = Point.Flows.
	Concurrency int
	// ValueSize is memaslap -X; 0 = Point.MsgSize, or 550 bytes (MFLOW's
	// object size) when that is 0 too.
	ValueSize int
}

const (
	defaultMemcachedPort = 11211
	defaultValueSize     = 550
)

func (Memcached) Name() string { return "memcached" }

func (w Memcached) Run(ctx context.Context, srv, cli Endpoint, p Point) (Result, error) {
	srv, cli = unmapped(srv), unmapped(cli)
	if err := checkEndpoints(w.Name(), srv, cli); err != nil {
		return Result{}, err
	}
	if srv.Addr.Is6() {
		return Result{}, fmt.Errorf("%s: memaslap takes host:port and cannot address IPv6 server %s", w.Name(), srv.Addr)
	}
	s, err := newSession(w.Name())
	if err != nil {
		return Result{}, err
	}
	defer s.close()

	port := portOr(p, defaultMemcachedPort)
	conc := w.Concurrency
	if conc <= 0 {
		conc = max(p.Flows, 1)
	}
	srvThreads := firstPositive(w.ServerThreads, len(srv.CPUs), 1)
	cliThreads := divisorAtMost(conc, firstPositive(w.ClientThreads, len(cli.CPUs), 1))
	value := firstPositive(w.ValueSize, p.MsgSize, defaultValueSize)

	addr := srv.Addr.String()
	sargs := []string{"-l", addr, "-p", itoa(port), "-U", "0", "-t", itoa(srvThreads),
		"-m", "1024", "-c", itoa(max(1024, 2*conc+64))}
	if os.Geteuid() == 0 {
		// memcached refuses to run as root unless told which user to be.
		sargs = append([]string{"-u", "root"}, sargs...)
	}
	sp, err := s.start(srv, "memcached", toolMemcached, sargs, "memcached.out", "")
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	if err := sp.waitReady(ctx, readiness{proto: "tcp", addr: srv.Addr, port: port, connect: true, cliNS: cli.NetNS}); err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}

	secs := wholeSeconds(p.Duration)
	args := []string{"-s", fmt.Sprintf("%s:%d", addr, port), "-t", itoa(secs) + "s",
		"-T", itoa(cliThreads), "-c", itoa(conc), "-X", itoa(value), "-S", itoa(secs+3600) + "s"}
	out, err := s.runClient(ctx, cli, p.Duration, "memaslap", toolMemaslap, args, sp)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	m, err := parseMemaslap(string(out))
	if err != nil {
		return Result{}, withTail(fmt.Errorf("%s: %w\n%s", w.Name(), err, tailString(string(out), 1500)), sp)
	}
	return m.result(), nil
}

// memaslapStats is one "Get/Set/Total Statistics (N events)" block.
type memaslapStats struct {
	Events              uint64
	MinUs, MaxUs        float64
	AvgUs, GeoUs, StdUs float64
	// Dist[i] counts operations whose latency t satisfies
	// 2^(i-1) < t <= 2^i µs (memaslap's ms_local_log2: the smallest i
	// with 2^i >= t); Dist[0] is t <= 1.
	Dist map[int]uint64
}

// memaslapOutput is memaslap's final report.
type memaslapOutput struct {
	Get, Set, Total *memaslapStats
	Counters        map[string]uint64 // cmd_get, cmd_set, get_misses, written_bytes, ...
	RunTimeS        float64
	Ops             uint64
	TPS             float64
}

var (
	msBlockRE = regexp.MustCompile(`^(Get|Set|Total) Statistics \((\d+) events\)`)
	msFieldRE = regexp.MustCompile(`^(Min|Max|Avg|Geo|Std):\s*([0-9.]+)`)
	msDistRE  = regexp.MustCompile(`^(\d+):((?:\s+\d+)+)$`)
	msCountRE = regexp.MustCompile(`^([a-z_]+):\s*(\d+)$`)
	msRunRE   = regexp.MustCompile(`Run time:\s*([0-9.]+)s\s+Ops:\s*(\d+)\s+TPS:\s*(\d+)`)
)

// memaslapCounters are the final counters worth keeping ("threads
// count:", "concurrency:" at the top have the same shape and are not).
var memaslapCounters = map[string]bool{
	"cmd_get": true, "cmd_set": true, "get_misses": true, "written_bytes": true,
	"read_bytes": true, "object_bytes": true, "verify_misses": true, "verify_failed": true,
	"expired_get": true, "unexpired_unget": true, "packet_disorder": true,
	"packet_drop": true, "udp_timeout": true,
}

// parseMemaslap reads memaslap's final report. The periodic tables
// ("Type Time(s) Ops TPS ...") that -S prints mid-run are ignored; the
// final per-command blocks hold the whole run.
func parseMemaslap(text string) (*memaslapOutput, error) {
	text = stripANSI(text)
	o := &memaslapOutput{Counters: map[string]uint64{}}
	var cur *memaslapStats
	inDist := false
	for _, raw := range strings.Split(text, "\n") {
		ln := strings.TrimSpace(raw)
		if m := msBlockRE.FindStringSubmatch(ln); m != nil {
			cur = &memaslapStats{Events: atou(m[2]), Dist: map[int]uint64{}}
			switch m[1] {
			case "Get":
				o.Get = cur
			case "Set":
				o.Set = cur
			default:
				o.Total = cur
			}
			inDist = false
			continue
		}
		if ln == "" {
			cur, inDist = nil, false
			continue
		}
		if cur != nil {
			if ln == "Log2 Dist:" {
				inDist = true
				continue
			}
			if m := msFieldRE.FindStringSubmatch(ln); m != nil && !inDist {
				v := atof(m[2])
				switch m[1] {
				case "Min":
					cur.MinUs = v
				case "Max":
					cur.MaxUs = v
				case "Avg":
					cur.AvgUs = v
				case "Geo":
					cur.GeoUs = v
				case "Std":
					cur.StdUs = v
				}
				continue
			}
			if m := msDistRE.FindStringSubmatch(ln); m != nil && inDist {
				// "8:    25794     1108 ..." = buckets 8, 9, ...
				i, _ := strconv.Atoi(m[1])
				for _, f := range strings.Fields(m[2]) {
					cur.Dist[i] = atou(f)
					i++
				}
				continue
			}
		}
		if m := msCountRE.FindStringSubmatch(ln); m != nil && memaslapCounters[m[1]] {
			o.Counters[m[1]] = atou(m[2])
		} else if m := msRunRE.FindStringSubmatch(ln); m != nil {
			o.RunTimeS, o.Ops, o.TPS = atof(m[1]), atou(m[2]), atof(m[3])
		}
	}
	if o.RunTimeS <= 0 || o.Ops == 0 {
		return nil, fmt.Errorf("memaslap \"Run time: ... Ops: ... TPS:\" line: %w", errNoResult)
	}
	return o, nil
}

// quantile estimates the q-quantile from the log2 histogram, linearly
// within the bucket and clamped to the observed min and max: accurate to
// within the bucket, i.e. a factor of two at worst.
func (s *memaslapStats) quantile(q float64) float64 {
	var n uint64
	idx := make([]int, 0, len(s.Dist))
	for i, c := range s.Dist {
		n += c
		idx = append(idx, i)
	}
	if n == 0 {
		return 0
	}
	sort.Ints(idx)
	target := q * float64(n)
	var cum float64
	for _, i := range idx {
		c := float64(s.Dist[i])
		if c == 0 {
			continue
		}
		if cum+c >= target {
			lo, hi := bucketBounds(i)
			lo, hi = max(lo, s.MinUs), min(hi, s.MaxUs)
			if hi < lo {
				hi = lo
			}
			return lo + (hi-lo)*(target-cum)/c
		}
		cum += c
	}
	return s.MaxUs
}

// bucketBounds is the latency range (µs) of histogram bucket i.
func bucketBounds(i int) (lo, hi float64) {
	if i == 0 {
		return 0, 1
	}
	return float64(uint64(1) << (i - 1)), float64(uint64(1) << i)
}

// cdf returns the histogram as CDF points at the bucket upper edges
// (clamped to the max): exact fractions, coarse latencies.
func (s *memaslapStats) cdf() []results.CDFPoint {
	var n uint64
	idx := make([]int, 0, len(s.Dist))
	for i, c := range s.Dist {
		n += c
		idx = append(idx, i)
	}
	if n == 0 {
		return nil
	}
	sort.Ints(idx)
	var out []results.CDFPoint
	var cum uint64
	for _, i := range idx {
		if s.Dist[i] == 0 {
			continue
		}
		cum += s.Dist[i]
		_, hi := bucketBounds(i)
		if s.MaxUs > 0 {
			hi = min(hi, s.MaxUs)
		}
		out = append(out, results.CDFPoint{Us: hi, Fraction: float64(cum) / float64(n)})
	}
	return out
}

func (o *memaslapOutput) result() Result {
	r := Result{
		PPS: o.TPS, // operations (request/response pairs) per second
		Extra: map[string]float64{
			"ops_per_sec": o.TPS,
			"ops":         float64(o.Ops),
		},
	}
	// Bytes the client application read (the responses), as wrk's
	// Transfer/sec for nginx.
	if rb, ok := o.Counters["read_bytes"]; ok && o.RunTimeS > 0 {
		r.ThroughputGbps = float64(rb) * 8 / o.RunTimeS / 1e9
	}
	for k, v := range o.Counters {
		r.Extra[k] = float64(v)
	}
	if o.RunTimeS > 0 {
		if g, ok := o.Counters["cmd_get"]; ok {
			r.Extra["get_per_sec"] = float64(g) / o.RunTimeS
		}
		if st, ok := o.Counters["cmd_set"]; ok {
			r.Extra["set_per_sec"] = float64(st) / o.RunTimeS
		}
	}
	if t := o.Total; t != nil {
		r.LatAvgUs = t.AvgUs
		r.LatMinUs = t.MinUs
		r.LatP50Us = t.quantile(0.50)
		r.LatP99Us = t.quantile(0.99)
		r.LatP999Us = t.quantile(0.999)
		r.LatCDF = t.cdf()
		r.Extra["max_us"] = t.MaxUs
		r.Extra["std_dev_us"] = t.StdUs
		r.Extra["geo_mean_us"] = t.GeoUs
	}
	if g := o.Get; g != nil {
		r.Extra["get_avg_us"] = g.AvgUs
		r.Extra["get_p99_us"] = g.quantile(0.99)
	}
	if st := o.Set; st != nil {
		r.Extra["set_avg_us"] = st.AvgUs
		r.Extra["set_p99_us"] = st.quantile(0.99)
	}
	return r
}

// firstPositive returns the first v > 0.
func firstPositive(vs ...int) int {
	for _, v := range vs {
		if v > 0 {
			return v
		}
	}
	return 0
}

// divisorAtMost is the largest divisor of n that is <= want (>= 1).
func divisorAtMost(n, want int) int {
	for d := min(want, n); d > 1; d-- {
		if n%d == 0 {
			return d
		}
	}
	return 1
}

func tailString(s string, n int) string {
	s = strings.TrimSpace(stripANSI(s))
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
