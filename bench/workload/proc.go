package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Timing of the process helper. Variables, not constants, only so a test
// could shorten them; nothing else changes them.
var (
	// readyTimeout bounds how long a server may take to start listening.
	readyTimeout = 10 * time.Second
	// pollInterval is how often readiness is re-checked.
	pollInterval = 10 * time.Millisecond
)

// clientTimeout is how long a client may run for a measurement of d: the
// tools add set-up time of their own (sockperf warms up for 400 ms,
// memaslap preloads its key window, iperf3 exchanges parameters), so the
// margin is generous; it only matters when something hangs.
func clientTimeout(d time.Duration) time.Duration {
	return d + d/5 + 15*time.Second
}

// wholeSeconds is d rounded up to whole seconds, at least 1: iperf3 -t,
// sockperf -t, memaslap -t and wrk -d take integer seconds.
func wholeSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// tool is an external program and the Debian package that ships it.
type tool struct {
	names []string // binary names to try, in order
	pkg   string
	// argv0, when set, is the name the program is started under (the
	// lanes binary runs its helpers by the name it was started as).
	argv0 string
}

var (
	toolIperf3    = tool{names: []string{"iperf3"}, pkg: "iperf3"}
	toolSockperf  = tool{names: []string{"sockperf"}, pkg: "sockperf"}
	toolMemcached = tool{names: []string{"memcached"}, pkg: "memcached"}
	// Debian renames memaslap to memcaslap (libmemcached-tools).
	toolMemaslap = tool{names: []string{"memcaslap", "memaslap"}, pkg: "libmemcached-tools"}
	toolNginx    = tool{names: []string{"nginx"}, pkg: "nginx-light"}
	toolWrk      = tool{names: []string{"wrk"}, pkg: "wrk"}
)

// sbinDirs are searched after PATH: nginx and memcached live in /usr/sbin
// on some distributions, and a non-login root shell's PATH may lack it.
var sbinDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"}

// path finds the tool or says which package to install.
func (t tool) path() (string, error) {
	for _, n := range t.names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	for _, n := range t.names {
		for _, d := range sbinDirs {
			p := filepath.Join(d, n)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found: install the Debian package %s (`make deps` installs it)", t.names[0], t.pkg)
}

// session is one Run's scratch directory and the processes it started.
// close kills and reaps every process and removes the directory, so a
// Run that defers close leaves nothing behind on any exit path.
type session struct {
	dir   string
	mu    sync.Mutex
	procs []*proc
}

func newSession(workload string) (*session, error) {
	dir, err := os.MkdirTemp("", "lanes-"+workload+"-")
	if err != nil {
		return nil, fmt.Errorf("%s: scratch dir: %w", workload, err)
	}
	return &session{dir: dir}, nil
}

func (s *session) path(name string) string { return filepath.Join(s.dir, name) }

// close stops the processes newest first (clients before servers).
func (s *session) close() {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop()
	}
	_ = os.RemoveAll(s.dir)
}

// proc is a started tool process, leader of its own process group.
type proc struct {
	name    string // label for errors: "iperf3-server"
	cmd     *exec.Cmd
	pid     int
	outPath string // stdout (and stderr for servers)
	errPath string // stderr; == outPath for servers
	// exited is closed when the leader has exited. It is observed with
	// waitid(WNOWAIT), which does not reap: until stop() reaps it, the
	// zombie keeps the pid, so the process group id cannot be recycled
	// and killing the group can never hit an unrelated process.
	exited   chan struct{}
	stopOnce sync.Once
	killed   bool  // stop() found it still running and killed it
	waitErr  error // the leader's exit status, after stop()
}

// start runs argv in ep's namespace, pinned to ep.CPUs, in a new process
// group, with its output going to files in the session directory (files,
// not pipes: no copying goroutines, nothing blocks if a child keeps the
// descriptor, and the output survives for error messages).
// stderr == "" sends stderr to the stdout file.
func (s *session) start(ep Endpoint, name string, t tool, args []string, stdout, stderr string) (*proc, error) {
	bin, err := t.path()
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, outPath: s.path(stdout), errPath: s.path(stdout), exited: make(chan struct{})}
	outf, err := os.Create(p.outPath)
	if err != nil {
		return nil, err
	}
	defer outf.Close() // the child has its own copy after Start
	errf := outf
	if stderr != "" {
		p.errPath = s.path(stderr)
		if errf, err = os.Create(p.errPath); err != nil {
			return nil, err
		}
		defer errf.Close()
	}
	cmd := exec.Command(bin, args...)
	if t.argv0 != "" {
		cmd.Args[0] = t.argv0
	}
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = outf, errf
	// Own process group so stop() can kill whatever the tool forks (nginx
	// workers). No Pdeathsig: it fires when the forking *thread* exits,
	// and that thread is thrown away right after Start (see onThread).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd = cmd
	if err := onThread(ep.NetNS, ep.CPUs, ep.idle, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, strings.Join(cmd.Args, " "), err)
	}
	p.pid = cmd.Process.Pid
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	go func() {
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				break
			}
		}
		close(p.exited)
	}()
	return p, nil
}

// onThread runs fn on a throwaway OS thread inside namespace ns whose CPU
// affinity is cpus and, if idle, whose policy is SCHED_IDLE, so a process
// fn forks inherits all three. The thread is never handed back to the Go
// scheduler: its goroutine stays locked and exits, and the runtime then
// ends the thread. With no namespace, no CPUs and not idle there is
// nothing to change and fn runs where it is called.
func onThread(ns string, cpus []int, idle bool, fn func() error) error {
	if len(cpus) == 0 && !idle {
		return nsx.Do(ns, fn)
	}
	var set unix.CPUSet
	set.Zero()
	for _, c := range cpus {
		if c < 0 || c >= len(set)*64 {
			return fmt.Errorf("cpu %d out of range", c)
		}
		set.Set(c)
	}
	pinned := func() error {
		// pid 0 = the calling thread, which nsx.Do (or we) locked.
		if len(cpus) > 0 {
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return fmt.Errorf("pinning to cpus %v: %w", cpus, err)
			}
		}
		if idle {
			if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
				return fmt.Errorf("SCHED_IDLE: %w", err)
			}
		}
		return fn()
	}
	if ns != "" {
		return nsx.Do(ns, pinned)
	}
	// nsx.Do runs fn on the caller's thread for the current namespace;
	// the affinity change must not leak into a scheduler thread.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		errc <- pinned()
	}()
	return <-errc
}

// stop kills the process group (if anything in it still runs) and reaps
// the leader. Safe to call more than once and from any exit path.
func (p *proc) stop() {
	p.stopOnce.Do(func() {
		select {
		case <-p.exited:
		default:
			p.killed = true
		}
		// The leader is not reaped yet (see exited), so -pid is still our
		// group. Also sent after a clean exit, for stragglers it forked.
		_ = unix.Kill(-p.pid, unix.SIGKILL)
		p.waitErr = p.cmd.Wait()
		<-p.exited
	})
}

// interrupt sends SIGINT to the leader and waits up to d for it to exit
// (tools print their totals on SIGINT), then stops it for good.
func (p *proc) interrupt(d time.Duration) error {
	_ = unix.Kill(p.pid, unix.SIGINT)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exited:
		p.stop()
		return nil
	case <-t.C:
		p.stop()
		return fmt.Errorf("%s did not exit within %v of SIGINT, so its count is lost (its output is below); rerun", p.name, d)
	}
}

// running reports whether the leader has not exited.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// tail returns the end of the process's stderr (or combined output) for
// error messages, or of its stdout when stderr is empty: some tools
// (wrk, memaslap) report failures on stdout.
func (p *proc) tail() string {
	if t := fileTail(p.errPath, 1500); t != "" || p.errPath == p.outPath {
		return t
	}
	return fileTail(p.outPath, 1500)
}

func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - n
	if off < 0 {
		off = 0
	}
	b := make([]byte, fi.Size()-off)
	_, _ = f.ReadAt(b, off)
	s := strings.TrimSpace(stripANSI(string(b)))
	if off > 0 {
		s = "..." + s
	}
	return s
}

// tailer is something whose output tail explains a failure.
type tailer interface {
	label() string
	tail() string
}

func (p *proc) label() string { return p.name }

// logFile is a tool's log file (nginx's error.log) as a tailer.
type logFile struct{ name, path string }

func (l logFile) label() string { return l.name }
func (l logFile) tail() string  { return fileTail(l.path, 1500) }

// withTail decorates err with the output tails of ts.
func withTail(err error, ts ...tailer) error {
	var b strings.Builder
	for _, t := range ts {
		if p, ok := t.(*proc); ok && p == nil {
			continue
		}
		if s := t.tail(); s != "" {
			fmt.Fprintf(&b, "\n--- %s:\n%s", t.label(), s)
		}
	}
	if b.Len() == 0 {
		return err
	}
	return fmt.Errorf("%w%s", err, b.String())
}

var ansiRE = regexp.MustCompile("\x1b\\[[0-9;?]*[A-Za-z]")

// stripANSI removes terminal escapes (sockperf colours its summary,
// memaslap clears the screen) even when output is not a terminal.
func stripANSI(s string) string { return ansiRE.ReplaceAllString(s, "") }

// runClient runs a client to completion in ep's namespace, with a timeout
// derived from the measurement duration d, and returns its stdout. On
// failure the error carries the client's and the server's output tails;
// stdout is returned too, since some tools (iperf3 -J) explain failures
// there.
func (s *session) runClient(ctx context.Context, ep Endpoint, d time.Duration, name string, t tool, args []string, server *proc) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, clientTimeout(d))
	defer cancel()
	c, err := s.start(ep, name, t, args, name+".out", name+".err")
	if err != nil {
		return nil, err
	}
	select {
	case <-c.exited:
	case <-cctx.Done():
	}
	c.stop()
	out, _ := os.ReadFile(c.outPath)
	switch {
	case c.killed && ctx.Err() != nil:
		return out, withTail(fmt.Errorf("%s: %w", name, ctx.Err()), c, server)
	case c.killed:
		return out, withTail(fmt.Errorf("%s: no result after %v (%s)", name, clientTimeout(d), strings.Join(c.cmd.Args, " ")), c, server)
	case c.waitErr != nil:
		return out, withTail(fmt.Errorf("%s (%s): %w", name, strings.Join(c.cmd.Args, " "), c.waitErr), c, server)
	}
	return out, nil
}

// readiness says how to tell that a server is ready for its client.
type readiness struct {
	proto string // "tcp": a listening socket; "udp": a bound socket
	addr  netip.Addr
	port  int
	// connect additionally polls a TCP connect from the client's
	// namespace (proves the path, not just the socket). Off for servers
	// that treat a bare connection as their one test (iperf3 -s -1).
	connect bool
	cliNS   string
}

// waitReady polls until the server owns a socket bound to addr:port (and,
// if asked, accepts a connection from the client's namespace), failing
// early if the server exits and after readyTimeout at most.
func (p *proc) waitReady(ctx context.Context, r readiness) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if !p.running() {
			return withTail(fmt.Errorf("%s exited before it was ready (%s)", p.name, strings.Join(p.cmd.Args, " ")), p)
		}
		ok, err := ownsSocket(p.pid, r.proto, r.addr, r.port)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return withTail(fmt.Errorf("%s not listening on %s/%s: %w", p.name, netip.AddrPortFrom(r.addr, uint16(r.port)), r.proto, ctx.Err()), p)
		case <-tick.C:
		}
	}
	if !r.connect {
		return nil
	}
	ap := netip.AddrPortFrom(r.addr, uint16(r.port)).String()
	// One throwaway thread in the client's namespace for the whole poll:
	// sockets take the namespace of the thread that creates them.
	err := nsx.Do(r.cliNS, func() error {
		var lastErr error
		for {
			d := net.Dialer{Timeout: 500 * time.Millisecond}
			c, err := d.DialContext(ctx, "tcp", ap)
			if err == nil {
				c.Close()
				return nil
			}
			lastErr = err
			if !p.running() {
				return fmt.Errorf("%s exited", p.name)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
			case <-tick.C:
			}
		}
	})
	if err != nil {
		return withTail(fmt.Errorf("%s: connecting to %s from netns %q: %w", p.name, ap, r.cliNS, err), p)
	}
	return nil
}

// ownsSocket reports whether process pid holds a socket of proto bound
// to addr (or the wildcard) and port, listening for TCP. It reads the
// socket tables of the process's own namespace (/proc/PID/net) and matches
// inodes against its descriptors, so another process's socket on the same
// port does not count.
func ownsSocket(pid int, proto string, addr netip.Addr, port int) (bool, error) {
	inodes, err := socketInodes(pid)
	if err != nil {
		return false, nil // process gone or going: the caller sees it exit
	}
	if len(inodes) == 0 {
		return false, nil
	}
	for _, table := range []string{proto, proto + "6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue // tcp6/udp6 are absent when IPv6 is disabled
		}
		if socketInTable(b, proto, addr, port, inodes) {
			return true, nil
		}
	}
	return false, nil
}

// socketInTable scans a /proc/net/{tcp,udp}[6] table.
func socketInTable(table []byte, proto string, addr netip.Addr, port int, inodes map[string]bool) bool {
	lines := bytes.Split(table, []byte("\n"))
	for _, ln := range lines[1:] {
		f := strings.Fields(string(ln))
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		if len(f) < 10 {
			continue
		}
		if proto == "tcp" && f[3] != "0A" { // TCP_LISTEN
			continue
		}
		a, pt, ok := parseProcAddr(f[1])
		if !ok || pt != port {
			continue
		}
		if a.Unmap() != addr.Unmap() && !a.IsUnspecified() {
			continue
		}
		if inodes[f[9]] {
			return true
		}
	}
	return false
}

// parseProcAddr decodes "0100A8C0:1F90": the address is the kernel's
// in-memory bytes printed as native-endian 32-bit words; the port is plain
// hex.
func parseProcAddr(s string) (netip.Addr, int, bool) {
	h, ps, ok := strings.Cut(s, ":")
	if !ok {
		return netip.Addr{}, 0, false
	}
	port, err := strconv.ParseUint(ps, 16, 16)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.Addr{}, 0, false
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.NativeEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(b)
	return a, int(port), true
}

// socketInodes returns the inodes of the sockets pid has open.
func socketInodes(pid int) (map[string]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	m := make(map[string]bool)
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			m[strings.TrimSuffix(ino, "]")] = true
		}
	}
	return m, nil
}

// errNoResult marks output a parser could not find its numbers in.
var errNoResult = errors.New("no result in output")

// unmapped returns ep with a v4-mapped IPv6 address turned into IPv4, the
// form the tools' command lines and configs expect.
func unmapped(ep Endpoint) Endpoint {
	ep.Addr = ep.Addr.Unmap()
	return ep
}

// checkEndpoints validates what every workload needs.
func checkEndpoints(name string, srv, cli Endpoint) error {
	if !srv.Addr.IsValid() {
		return fmt.Errorf("%s: server endpoint has no address", name)
	}
	if srv.NetNS != "" && !nsx.Exists(srv.NetNS) {
		return fmt.Errorf("%s: server netns %q does not exist", name, srv.NetNS)
	}
	if cli.NetNS != "" && !nsx.Exists(cli.NetNS) {
		return fmt.Errorf("%s: client netns %q does not exist", name, cli.NetNS)
	}
	return nil
}

// portOr returns p.Port, or def when the point leaves it unset.
func portOr(p Point, def int) int {
	if p.Port > 0 {
		return p.Port
	}
	return def
}

func itoa(i int) string { return strconv.Itoa(i) }
