package workload

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The paced ping-pong client: sockperf's UDP ping-pong, with a client that
// waits for its next send by sleeping rather than spinning.
//
// Why. sockperf's client paces --mps by busy-waiting on the clock between
// a reply and the next send (SwitchOnCycleDuration in its switches.h):
// at 1000 messages/s it keeps its core about 90% busy. The papers ran it on
// a client machine of its own. On a 2-core testbed it shares the sending
// core with the stress generator, whose thread runs SCHED_IDLE so that
// nothing it shares a core with waits for it (stress.GenConfig.Yield): it
// then got the core only while sockperf waited in epoll for a reply. The
// background PRISM's evaluation calls evenly spaced came in catch-up bursts
// once a millisecond, in step with the ping-pong: measured on the 2 x Intel
// Xeon vCPU VM (2026-11-25), 47% of a 30 Kpps background was sent late and
// the generator dropped its backlog 1000-1600 times in a 5 s run at 50-95%
// (`bg_late_share`, `bg_gen_stalls`), against 0.3% late and no drop for the
// same generator with nothing spinning beside it. This client sends at the
// same rate, sleeping in between (clock_nanosleep to an absolute time,
// timer slack 1 ns), so the generator keeps its pace and the receive core
// sees the load the run is labelled with.
//
// What stays sockperf's: the server (sockperf sr, unchanged, on the
// receive core), the message (sockperf's 14-byte header: sequence number,
// flags client|pong-request, length; network byte order) and the figure
// (one-way latency = round trip / 2, from the client's clock just before
// the send and just after the reply's receive). What differs: a lost
// message or reply does not end the run (sockperf never resends and
// stops); the client waits up to pacedReplyTimeout for it, counts it lost
// and goes on with the next one.
//
// A core that has nothing to run halts, and a halted vCPU takes tens of µs
// to wake for the reply (this VM's haltpoll idle driver polls only up to
// 200 µs, less once idle periods run longer). sockperf's spinning client
// never lets its core halt, and in a run with background neither does the
// generator (it spins at SCHED_IDLE whenever nothing else runs). For a run
// without it, -spin keeps the core from halting the same way: a second
// thread spins at SCHED_IDLE, which any other task preempts at once. Not
// beside the generator: two SCHED_IDLE spinners share the core in
// scheduler slices of a millisecond or more, and the generator would fall
// behind again.
//
// The client runs as a process of its own (the lanes binary started under
// the name pacedArgv0, see RunHelper), so no other goroutine, garbage
// collection or Go scheduler decision of the benchmark's process can come
// between a reply and its timestamp.

// pacedArgv0 is the name the benchmark starts its own binary under to run
// the paced client.
const pacedArgv0 = "lanes-paced-pingpong"

// pacedReplyTimeout is how long the client waits for one reply before it
// counts the message lost: far above any round trip measured here (the
// longest, 9 ms, under 95% background), so only a real loss times out.
const pacedReplyTimeout = 200 * time.Millisecond

// pacedWarmup is excluded from the figures at the start of a run, as
// sockperf excludes its warm-up: the first messages pay for ARP, the
// bridge's learning and cold caches.
const pacedWarmup = 400 * time.Millisecond

// sockperf's message header (src/message.h): sequence number, flags,
// length, 14 bytes, network byte order.
const (
	spHeaderLen  = 14
	spFlagClient = 1
	spFlagPong   = 2
	spMinMsgSize = spHeaderLen
)

// RunHelper runs the helper process this binary was started as, if any,
// and exits; otherwise it returns at once. Call it first thing in main (and
// in TestMain of packages whose tests run the paced ping-pong).
func RunHelper() {
	if filepath.Base(os.Args[0]) != pacedArgv0 {
		return
	}
	if err := pacedMain(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", pacedArgv0, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// pacedArgs is one paced ping-pong run.
type pacedArgs struct {
	Server   netip.AddrPort
	ClientIP netip.Addr // zero: the kernel picks
	Rate     int        // messages/s
	Size     int        // message bytes, header included
	Duration time.Duration
	Warmup   time.Duration
	Log      string // per-message latencies (µs), one per line
	Spin     bool   // keep the core from halting between messages
}

// pacedSummary is what the client prints, one JSON object.
type pacedSummary struct {
	MeasuredS float64 `json:"measured_s"` // the window after the warm-up
	Sent      uint64  `json:"sent"`       // messages sent in it
	Received  uint64  `json:"received"`   // replies to them
	Lost      uint64  `json:"lost"`       // no reply within pacedReplyTimeout
	Stray     uint64  `json:"stray"`      // replies to a message already counted lost, or not ours
	Behind    uint64  `json:"behind"`     // sends later than their slot by more than an interval
}

func (a pacedArgs) argv() []string {
	args := []string{
		"-server", a.Server.String(),
		"-rate", strconv.Itoa(a.Rate),
		"-size", strconv.Itoa(a.Size),
		"-duration", a.Duration.String(),
		"-warmup", a.Warmup.String(),
		"-log", a.Log,
	}
	if a.ClientIP.IsValid() {
		args = append(args, "-client-ip", a.ClientIP.String())
	}
	if a.Spin {
		args = append(args, "-spin")
	}
	return args
}

func parsePacedArgs(argv []string) (pacedArgs, error) {
	fs := flag.NewFlagSet(pacedArgv0, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	server := fs.String("server", "", "server address:port")
	client := fs.String("client-ip", "", "address to send from")
	var a pacedArgs
	fs.IntVar(&a.Rate, "rate", 1000, "messages/s")
	fs.IntVar(&a.Size, "size", 64, "message bytes")
	fs.DurationVar(&a.Duration, "duration", 5*time.Second, "measured time after the warm-up")
	fs.DurationVar(&a.Warmup, "warmup", pacedWarmup, "time before the measurement")
	fs.StringVar(&a.Log, "log", "", "per-message latency file")
	fs.BoolVar(&a.Spin, "spin", false, "keep the core from halting between messages")
	if err := fs.Parse(argv); err != nil {
		return a, err
	}
	var err error
	if a.Server, err = netip.ParseAddrPort(*server); err != nil || !a.Server.Addr().Is4() {
		return a, fmt.Errorf("-server %q: want an IPv4 address:port", *server)
	}
	if *client != "" {
		if a.ClientIP, err = netip.ParseAddr(*client); err != nil || !a.ClientIP.Is4() {
			return a, fmt.Errorf("-client-ip %q: want an IPv4 address", *client)
		}
	}
	switch {
	case a.Rate < 1 || a.Rate > 100000:
		return a, fmt.Errorf("-rate %d: want 1..100000 messages/s", a.Rate)
	case a.Size < spMinMsgSize || a.Size > 65000:
		return a, fmt.Errorf("-size %d: want %d..65000 bytes (sockperf's header is %d)", a.Size, spMinMsgSize, spHeaderLen)
	case a.Duration <= 0 || a.Warmup < 0:
		return a, fmt.Errorf("-duration %v -warmup %v: want a positive duration and a warm-up >= 0", a.Duration, a.Warmup)
	case a.Log == "":
		return a, errors.New("-log: want a file for the per-message latencies")
	}
	return a, nil
}

func pacedMain(argv []string, stdout io.Writer) error {
	a, err := parsePacedArgs(argv)
	if err != nil {
		return err
	}
	// One thread does everything; with -spin a second one keeps the core
	// busy. Each holds a P of its own, or a reply's thread would wait for
	// the spinner's P (the process may be pinned to one core, which sets
	// GOMAXPROCS to 1).
	runtime.GOMAXPROCS(2)
	runtime.LockOSThread()
	if a.Spin {
		started := make(chan error, 1)
		go spinIdle(started)
		if err := <-started; err != nil {
			return err
		}
	}
	// Sleep to the nanosecond asked for, not to the next 50 µs of the
	// default slack: the sends keep their slots.
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("timer slack: %w", err)
	}
	fd, err := pacedSocket(a)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	lat, sum, err := pacedRun(fd, a)
	if err != nil {
		return err
	}
	if err := writeLatencies(a.Log, lat); err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(sum)
}

// spinIdle busy-loops at SCHED_IDLE on a thread of its own, for good.
func spinIdle(started chan<- error) {
	runtime.LockOSThread()
	a := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	if err := unix.SchedSetAttr(0, a, 0); err != nil {
		started <- fmt.Errorf("spinner at SCHED_IDLE: %w", err)
		return
	}
	started <- nil
	for {
		spinSink++
	}
}

// spinSink is what spinIdle's loop writes, so the loop is not empty.
var spinSink uint64

// pacedSocket is a blocking UDP socket connected to the server, so it
// receives nothing but the server's replies.
func pacedSocket(a pacedArgs) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	if a.ClientIP.IsValid() {
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: a.ClientIP.As4()}); err != nil {
			return fail("bind "+a.ClientIP.String(), err)
		}
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: a.Server.Addr().As4(), Port: int(a.Server.Port())}); err != nil {
		return fail("connect "+a.Server.String(), err)
	}
	tv := unix.NsecToTimeval(pacedReplyTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("SO_RCVTIMEO", err)
	}
	return fd, nil
}

// monoNs is CLOCK_MONOTONIC in ns (vDSO, no system call).
func monoNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// sleepUntil sleeps to the absolute CLOCK_MONOTONIC time t (ns).
func sleepUntil(t int64) {
	ts := unix.NsecToTimespec(t)
	for {
		err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// pacedRun sends message i at start + i/rate (or at once, if the reply to
// message i-1 came later than that: like sockperf, one message in flight),
// waits for its reply and records half the round trip. It returns the
// latencies (µs) of the messages sent after the warm-up.
func pacedRun(fd int, a pacedArgs) ([]float64, pacedSummary, error) {
	interval := int64(time.Second) / int64(a.Rate)
	total := a.Warmup + a.Duration
	n := int64(total) / interval
	lat := make([]float64, 0, int64(a.Duration)/interval+1)
	msg := make([]byte, a.Size)
	reply := make([]byte, a.Size+64)
	var sum pacedSummary
	start := monoNs() + interval
	measureFrom := start + int64(a.Warmup)
	for i := int64(0); i < n; i++ {
		slot := start + i*interval
		if now := monoNs(); now < slot {
			sleepUntil(slot)
		} else if now-slot > interval {
			// The previous reply came late: this one goes at once.
			if slot >= measureFrom {
				sum.Behind++
			}
		}
		seq := uint64(i + 1)
		binary.BigEndian.PutUint64(msg[0:8], seq)
		binary.BigEndian.PutUint16(msg[8:10], spFlagClient|spFlagPong)
		binary.BigEndian.PutUint32(msg[10:14], uint32(a.Size))
		measured := slot >= measureFrom
		t0 := monoNs()
		if _, err := unix.Write(fd, msg); err != nil {
			if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
				// An ICMP error from an earlier datagram, or a full
				// queue: this message is lost, the run goes on.
				if measured {
					sum.Sent++
					sum.Lost++
				}
				continue
			}
			return nil, sum, fmt.Errorf("send: %w", err)
		}
		if measured {
			sum.Sent++
		}
		got := false
		for !got {
			k, err := unix.Read(fd, reply)
			t1 := monoNs()
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN || err == unix.ECONNREFUSED:
				// Timed out (or the server's port was closed): lost.
				if measured {
					sum.Lost++
				}
				got = true
				continue
			case err != nil:
				return nil, sum, fmt.Errorf("receive: %w", err)
			}
			if k < spHeaderLen || binary.BigEndian.Uint64(reply[0:8]) != seq ||
				binary.BigEndian.Uint16(reply[8:10])&spFlagClient != 0 {
				// A late reply to a message counted lost: drop it and
				// keep waiting for this one's (the timeout restarts,
				// which only lengthens a wait that is already a loss).
				sum.Stray++
				continue
			}
			got = true
			if measured {
				sum.Received++
				lat = append(lat, float64(t1-t0)/2e3)
			}
		}
	}
	sum.MeasuredS = float64(n*interval-int64(a.Warmup)) / 1e9
	return lat, sum, nil
}

func writeLatencies(path string, lat []float64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, 16*len(lat))
	for _, v := range lat {
		buf = strconv.AppendFloat(buf, v, 'f', 3, 64)
		buf = append(buf, '\n')
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// selfTool is this binary, started as the paced client.
func selfTool() (tool, error) {
	exe, err := os.Executable()
	if err != nil {
		return tool{}, fmt.Errorf("finding the lanes binary for the paced client: %w", err)
	}
	return tool{names: []string{exe}, pkg: "lanes", argv0: pacedArgv0}, nil
}

// runPaced runs the paced client against the sockperf server sp already
// started and ready, and builds the Result as sockperf's own client's.
func (w PingPong) runPaced(ctx context.Context, s *session, srv, cli Endpoint, p Point, port int, sp *proc) (Result, error) {
	self, err := selfTool()
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	a := pacedArgs{
		Server:   netip.AddrPortFrom(srv.Addr, uint16(port)),
		ClientIP: cli.Addr,
		Rate:     p.Rate,
		Size:     max(p.MsgSize, spMinMsgSize),
		Duration: p.Duration,
		Warmup:   pacedWarmup,
		Log:      s.path("paced-latencies.txt"),
		Spin:     w.Spin,
	}
	out, err := s.runClient(ctx, cli, a.Warmup+a.Duration, "paced-pingpong", self, a.argv(), sp)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	var sum pacedSummary
	if err := json.Unmarshal(out, &sum); err != nil {
		return Result{}, withTail(fmt.Errorf("%s: paced client's summary: %v: %w", w.Name(), err, errNoResult),
			logFile{"paced-pingpong", s.path("paced-pingpong.out")}, logFile{"paced-pingpong stderr", s.path("paced-pingpong.err")}, sp)
	}
	f, err := os.Open(a.Log)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	lat, err := readLatencies(f)
	f.Close()
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	if err := sum.short(p.Rate); err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	return sum.asSockperf(lat).result("udp", lat), nil
}

// short fails a run that got replies to fewer than 80% of the messages its
// rate asked for (the bar sockperfSummary.stalled sets for sockperf's
// client): lost ones, or a client held off its core.
func (s pacedSummary) short(rate int) error {
	want := float64(rate) * s.MeasuredS
	if float64(s.Received) >= 0.8*want {
		return nil
	}
	return fmt.Errorf("paced ping-pong: %d replies to %d messages in the %.3f s measured, about %.0f at %d/s (%d lost): %w",
		s.Received, s.Sent, s.MeasuredS, want, rate, s.Lost, errNoResult)
}

// asSockperf is the summary in sockperf's terms, with its statistics taken
// from the latencies (µs): what sockperf's client would have printed.
func (s pacedSummary) asSockperf(lat []float64) *sockperfSummary {
	out := &sockperfSummary{
		RunTimeS:     s.MeasuredS,
		Sent:         s.Sent,
		Received:     s.Received,
		Dropped:      s.Lost,
		Observations: uint64(len(lat)),
		Percentiles:  map[string]float64{},
		hasN:         true,
	}
	if len(lat) == 0 {
		return out
	}
	var sum, sq float64
	out.MinUs, out.MaxUs = lat[0], lat[0]
	for _, v := range lat {
		sum += v
		out.MinUs, out.MaxUs = min(out.MinUs, v), max(out.MaxUs, v)
	}
	out.AvgUs = sum / float64(len(lat))
	for _, v := range lat {
		sq += (v - out.AvgUs) * (v - out.AvgUs)
	}
	out.StdDevUs = math.Sqrt(sq / float64(len(lat)))
	out.hasMin, out.hasMax = true, true
	return out
}

// readLatencies reads writeLatencies' file.
func readLatencies(r io.Reader) ([]float64, error) {
	sc := bufio.NewScanner(r)
	var out []float64
	for sc.Scan() {
		ln := strings.TrimSpace(sc.Text())
		if ln == "" {
			continue
		}
		v, err := strconv.ParseFloat(ln, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("paced client's latency file: bad line %q", ln)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}
