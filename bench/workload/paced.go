package workload

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/stats"
)

// The paced ping-pong client: sockperf's UDP ping-pong, with a client that
// waits for its next send by sleeping rather than spinning.
//
// Why. sockperf's client paces --mps by busy-waiting on the clock between a
// reply and the next send (SwitchOnCycleDuration in its switches.h): at
// 1000 messages/s it keeps its core busy nearly all the time. The papers
// ran it on a client machine of its own. On a 2-core testbed it shares the
// sending core with the stress generator, whose thread runs SCHED_IDLE so
// that nothing it shares a core with waits for it (stress.GenConfig.Yield):
// it then gets the core only while sockperf waits in epoll for a reply. The
// background PRISM's evaluation calls evenly spaced comes in catch-up
// bursts once a millisecond, in step with the ping-pong: much of it is sent
// late and the generator drops its backlog again and again (`bg_late_share`
// and `bg_gen_stalls` say how much), where the same generator with nothing
// spinning beside it keeps its schedule. This client sends at the same
// rate, sleeping in between (clock_nanosleep to an absolute time, timer
// slack 1 ns), so the generator keeps its pace and the receive core sees
// the load the run is labelled with.
//
// What stays sockperf's: the server (sockperf sr, unchanged, on the
// receive core), the message (sockperf's 14-byte header: sequence number,
// flags client|pong-request, length; network byte order) and the figure
// (one-way latency = round trip / 2, from the client's clock just before
// the send and just after the reply's receive). What differs: a lost
// message or reply does not end the run (sockperf never resends and
// stops); the client waits up to pacedReplyTimeout for it, counts it lost
// and goes on at the next slot still ahead. Slots that went by meanwhile
// are skipped and counted, never sent in a catch-up burst: that would
// offer the service more than its rate (and, under prism's high=auto,
// could make a light rule look busy). A reply a little slower than the
// interval delays only the next few sends (pacedCatchUp).
//
// A core that has nothing to run halts, and a halted vCPU is slow to wake
// for the reply (docs/testbed.md; this VM's haltpoll idle driver polls only
// up to 200 µs, less once idle periods run longer). sockperf's spinning
// client never lets its core halt, and in a run with background neither
// does the generator (it spins at SCHED_IDLE whenever nothing else runs).
// For a run without it, PingPong.Spin keeps the core from halting the same
// way: a process beside the client spins at SCHED_IDLE, which any other
// task preempts at once. Not beside the generator: two SCHED_IDLE spinners
// share the core in scheduler slices of a millisecond or more, and the
// generator would fall behind again.
//
// The client runs as a process of its own (the lanes binary started under
// the name pacedArgv0, see RunHelper), so no other goroutine, garbage
// collection or Go scheduler decision of the benchmark's process can come
// between a reply and its timestamp.

// pacedArgv0 is the name the benchmark starts its own binary under to run
// the paced client.
const pacedArgv0 = "lanes-paced-pingpong"

// spinArgv0 is the name it starts its own binary under to keep the
// client's core from halting (PingPong.Spin).
const spinArgv0 = "lanes-idle-spin"

// pacedReplyTimeout is how long the client waits for one reply before it
// counts the message lost: four times the longest round trip under the
// heaviest background the bench offers (95%, in trains of 64), so only a
// real loss times out, and a loss costs a run at 1000/s 20 slots.
const pacedReplyTimeout = 20 * time.Millisecond

// pacedCatchUp is how far behind its schedule the client may fall and still
// send at once, catching up (at least two intervals): a slow reply or a
// stall of the VM (it happens even on an idle testbed) costs no
// slot and at most ten sends back to back at 1000/s, while a wait for a
// lost one (pacedReplyTimeout) skips its slots rather than sending them
// back to back.
const pacedCatchUp = 10 * time.Millisecond

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
	var err error
	switch name := filepath.Base(os.Args[0]); name {
	case pacedArgv0:
		err = pacedMain(os.Args[1:], os.Stdout)
	case spinArgv0:
		err = spinIdle()
	default:
		helperReady = true
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// helperReady says RunHelper ran in this process (and returned): the
// binary can be started as the paced client.
var helperReady bool

// pacedArgs is one paced ping-pong run.
type pacedArgs struct {
	Server   netip.AddrPort
	ClientIP netip.Addr // zero: the kernel picks
	Rate     int        // messages/s
	Size     int        // message bytes, header included
	Duration time.Duration
	Warmup   time.Duration
	Log      string // per-message log, sockperf's --full-log table
}

// pacedSummary is what the client prints, one JSON object.
type pacedSummary struct {
	MeasuredS  float64 `json:"measured_s"`  // the window after the warm-up: its slots x the interval
	Sent       uint64  `json:"sent"`        // messages sent in it
	Received   uint64  `json:"received"`    // replies to them
	Lost       uint64  `json:"lost"`        // no reply within pacedReplyTimeout
	SendFailed uint64  `json:"send_failed"` // sends the kernel refused (an earlier datagram's ICMP error, a full queue)
	Skipped    uint64  `json:"skipped"`     // slots that went by while a reply was awaited: not sent
	Late       uint64  `json:"late"`        // sent more than an interval after their slot (a slow reply before)
	Stray      uint64  `json:"stray"`       // replies to a message already counted lost, or not ours
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
	fs.StringVar(&a.Log, "log", "", "per-message log file")
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
		return a, errors.New("-log: want a file for the per-message log")
	}
	return a, nil
}

func pacedMain(argv []string, stdout io.Writer) error {
	a, err := parsePacedArgs(argv)
	if err != nil {
		return err
	}
	// One thread does everything, and a second P stays idle, so the
	// runtime's monitor does not take this thread's P each time it blocks.
	runtime.GOMAXPROCS(2)
	runtime.LockOSThread()
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

// spinIdle is the idle spinner's process: it busy-loops at SCHED_IDLE
// until killed. A process of its own, not a thread of the client's: in
// the client's runtime a spinning goroutine held a P the client's thread
// then waited for after its sleeps, and replies came milliseconds late.
func spinIdle() error {
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	a := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	if err := unix.SchedSetAttr(0, a, 0); err != nil {
		return fmt.Errorf("SCHED_IDLE: %w", err)
	}
	//lint:ignore SA5002 spinning is this process's job
	for {
	}
}

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

// monoNs is CLOCK_MONOTONIC in ns, the clock clock_nanosleep sleeps on
// (a system call here: only for the schedule, never inside a round trip,
// which time.Now times through the vDSO).
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

// pacedRun sends message i at start + i/rate, one message in flight (as
// sockperf's ping-pong), waits for its reply and records half the round
// trip. A slot that went by while a reply was awaited is skipped, not
// sent late. It returns the answered messages whose slots lie after the
// warm-up.
func pacedRun(fd int, a pacedArgs) ([]pacedSample, pacedSummary, error) {
	interval := int64(time.Second) / int64(a.Rate)
	n := int64(a.Warmup+a.Duration) / interval
	first := (int64(a.Warmup) + interval - 1) / interval // first measured slot
	lat := make([]pacedSample, 0, n-first+1)
	msg := make([]byte, a.Size)
	reply := make([]byte, a.Size+64)
	sum := pacedSummary{MeasuredS: float64((n-first)*interval) / 1e9}
	start := monoNs() + interval
	epoch := time.Now()
	for i := int64(0); i < n; i++ {
		slot := start + i*interval
		switch late := monoNs() - slot; {
		case late < 0:
			sleepUntil(slot)
		case late > max(int64(pacedCatchUp), 2*interval):
			// A reply timed out, or came very late: go on at the next
			// slot still ahead.
			next := min(i+late/interval+1, n)
			sum.Skipped += uint64(max(0, next-max(i, first)))
			i = next - 1
			continue
		case late > interval && i >= first:
			// A reply came a little late: this one goes now, and the
			// next ones catch up to the schedule within a few slots.
			sum.Late++
		}
		measured := i >= first
		seq := uint64(i + 1)
		binary.BigEndian.PutUint64(msg[0:8], seq)
		binary.BigEndian.PutUint16(msg[8:10], spFlagClient|spFlagPong)
		binary.BigEndian.PutUint32(msg[10:14], uint32(a.Size))
		t0 := time.Now()
		if _, err := unix.Write(fd, msg); err != nil {
			if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
				// An ICMP error from an earlier datagram, or a full
				// queue: nothing went out, the run goes on.
				if measured {
					sum.SendFailed++
				}
				continue
			}
			return nil, sum, fmt.Errorf("send: %w", err)
		}
		if measured {
			sum.Sent++
		}
		for {
			k, err := unix.Read(fd, reply)
			t1 := time.Now()
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN || err == unix.ECONNREFUSED {
				// Timed out (or the server's port was closed): lost.
				if measured {
					sum.Lost++
				}
				break
			}
			if err != nil {
				return nil, sum, fmt.Errorf("receive: %w", err)
			}
			if k < spHeaderLen || binary.BigEndian.Uint64(reply[0:8]) != seq ||
				binary.BigEndian.Uint16(reply[8:10])&spFlagClient != 0 {
				// A late reply to a message counted lost: drop it and
				// keep waiting for this one's.
				sum.Stray++
				continue
			}
			if measured {
				sum.Received++
				lat = append(lat, pacedSample{seq: seq, tx: t0.Sub(epoch), rx: t1.Sub(epoch)})
			}
			break
		}
	}
	return lat, sum, nil
}

// pacedSample is one answered message: its send and its reply's receive,
// from the start of the run.
type pacedSample struct {
	seq    uint64
	tx, rx time.Duration
}

// writeLatencies writes the samples as sockperf's --full-log table
// ("packet, txTime(sec), rxTime(sec), latency(usec)", latency half the
// round trip, up to a dashed line), which parseSockperfFullLog reads: one
// per-message log format for both clients.
func writeLatencies(path string, lat []pacedSample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, 64+48*len(lat))
	buf = append(buf, "packet, txTime(sec), rxTime(sec), latency(usec)\n"...)
	for _, v := range lat {
		buf = fmt.Appendf(buf, "%d, %.9f, %.9f, %.3f\n", v.seq, v.tx.Seconds(), v.rx.Seconds(), float64((v.rx-v.tx).Nanoseconds())/2e3)
	}
	buf = append(buf, "------------------------------\n"...)
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// selfTool is this binary, started as one of its helpers (argv0).
// /proc/self/exe, not the path it was started from: a binary rebuilt or
// removed during a run still starts as the build that is running.
func selfTool(argv0 string) (tool, error) {
	if !helperReady {
		// The binary would not know the name and run itself again (a
		// test binary: its whole suite) in the client's namespace.
		return tool{}, errors.New("the paced client needs workload.RunHelper called first thing in main (or TestMain)")
	}
	return tool{names: []string{"/proc/self/exe"}, pkg: "lanes", argv0: argv0}, nil
}

// runPaced runs the paced client against the sockperf server sp already
// started and ready, and builds the Result as sockperf's own client's.
func (w PingPong) runPaced(ctx context.Context, s *session, srv, cli Endpoint, p Point, port int, sp *proc) (Result, error) {
	self, err := selfTool(pacedArgv0)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	if w.Spin {
		// On the client's cores, until the session closes.
		spin, _ := selfTool(spinArgv0)
		if _, err := s.start(cli, "idle-spinner", spin, nil, "idle-spinner.out", ""); err != nil {
			return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
		}
	}
	a := pacedArgs{
		Server:   netip.AddrPortFrom(srv.Addr, uint16(port)),
		ClientIP: cli.Addr,
		Rate:     p.Rate,
		Size:     max(p.MsgSize, spMinMsgSize),
		Duration: p.Duration,
		Warmup:   pacedWarmup,
		Log:      s.path("paced-latencies.txt"),
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
	lat, err := parseSockperfFullLog(f)
	f.Close()
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", w.Name(), err)
	}
	if err := sum.short(p.Rate); err != nil {
		return Result{}, withTail(fmt.Errorf("%s: %w", w.Name(), err), sp)
	}
	r := sum.asSockperf(lat).result("udp", lat)
	// Which client measured (sockperf's runs have none of these), and
	// what it could not send at its slots.
	r.Extra["paced_client"] = 1
	r.Extra["paced_spin"] = b2f(w.Spin)
	r.Extra["send_failed"] = float64(sum.SendFailed)
	r.Extra["skipped"] = float64(sum.Skipped)
	r.Extra["sent_late"] = float64(sum.Late)
	r.Extra["stray"] = float64(sum.Stray)
	return r, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// short fails a run that measured too little to stand for its rate: fewer
// than half the messages the rate asked for were answered (the client was
// held off its core, or the path broke). Lost replies alone do not fail a
// run: under a heavy background the receive ring drops some of the
// ping-pong's datagrams too (in trains of 64 at 80-95%), which is a
// result (`dropped`, and the report's loss column), with the latency of
// the answered ones beside it.
func (s pacedSummary) short(rate int) error {
	want := float64(rate) * s.MeasuredS
	if float64(s.Received) >= 0.5*want {
		return nil
	}
	return fmt.Errorf("paced ping-pong: %d replies to %d messages in the %.3f s measured, about %.0f at %d/s (%d lost, %d slots skipped while waiting, %d sends refused): %w",
		s.Received, s.Sent, s.MeasuredS, want, rate, s.Lost, s.Skipped, s.SendFailed, errNoResult)
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
	// Min, max and the percentiles: result() takes them from the samples.
	var sum float64
	for _, v := range lat {
		sum += v
	}
	out.AvgUs = sum / float64(len(lat))
	out.StdDevUs = stats.StdDev(lat)
	return out
}
