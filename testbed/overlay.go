package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/mountinfo"
	"github.com/lanesnet/lanes/internal/nsx"
)

// The overlays the real daemons build. lanes' own layouts (build.go) are
// for fast iteration; what operators run is what flanneld and dockerd
// build, so the testbed can have them build the overlay on its two hosts
// instead: each daemon runs inside a host's namespace, over the same
// NIC-like underlay, and the testbed records what it chose (VNI, port,
// addresses, MACs, namespaces).
const (
	// OverlayFlanneld: flanneld (vxlan backend) on each host with etcd on
	// the first host's underlay address as its store; containers attach
	// as Flannel's CNI plugin attaches them, through the bridge and
	// host-local plugins (flannel.go).
	OverlayFlanneld = "flanneld"
	// OverlayDockerd: one dockerd per host, a swarm across the two, an
	// attachable overlay network, containers started by dockerd
	// (docker.go).
	OverlayDockerd = "dockerd"
)

// Overlays lists the daemons Up can have build the overlay.
var Overlays = []string{OverlayFlanneld, OverlayDockerd}

// ValidateOverlay reports, as a one-line fix-it, an overlay the testbed
// does not know or a topology it does not build (c with its defaults).
func (c Config) ValidateOverlay() error { return c.validateOverlay() }

func (c Config) validateOverlay() error {
	if c.NoForwardRules && c.Overlay != OverlayFlanneld {
		return fmt.Errorf("--flanneld-forward-rules=false is flanneld's: add --overlay flanneld")
	}
	switch c.Overlay {
	case "":
	case OverlayFlanneld:
		if c.Topology != Flannel {
			return fmt.Errorf("--overlay flanneld builds Flannel's layout: drop --topology %s", c.Topology)
		}
	case OverlayDockerd:
		if c.Topology != Docker {
			return fmt.Errorf("--overlay dockerd builds Docker's layout: drop --topology %s", c.Topology)
		}
	default:
		return fmt.Errorf("unknown overlay %q: use %s (or none, for lanes' own)", c.Overlay, strings.Join(Overlays, " or "))
	}
	return nil
}

// DataDir holds the real daemons' persistent state (dockerd's data-root,
// etcd's data, the CNI address store), RunDir their run state (sockets,
// pid files, logs, dockerd's exec-root with its bound namespaces), one
// directory per testbed prefix in each. Down removes both. RunDir is
// short and fixed: containerd's socket paths under it must fit a unix
// socket address (108 bytes), and bpffs refuses the pin names lanes
// derives from namespace paths with a dot.
var (
	DataDir = "/var/lib/lanes/testbed"
	RunDir  = "/run/lanes/tb"
)

func runDir(prefix string) string  { return filepath.Join(RunDir, prefix) }
func dataDir(prefix string) string { return filepath.Join(DataDir, prefix) }

func hostRunDir(prefix string, h int) string {
	return filepath.Join(runDir(prefix), fmt.Sprintf("h%d", h))
}
func hostDataDir(prefix string, h int) string {
	return filepath.Join(dataDir(prefix), fmt.Sprintf("h%d", h))
}

// buildOverlay has the daemons build the overlay on both hosts, once the
// underlay is up, and fills in the hosts from what they built.
func (tb *Testbed) buildOverlay() error {
	for h := 1; h <= 2; h++ {
		for _, d := range []string{hostRunDir(tb.Config.Prefix, h), hostDataDir(tb.Config.Prefix, h)} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return err
			}
		}
	}
	switch tb.Config.Overlay {
	case OverlayFlanneld:
		return tb.buildFlannel()
	case OverlayDockerd:
		return tb.buildDocker()
	}
	return nil
}

// ErrNoDaemon is matched (errors.Is) by the error of an Up whose overlay's
// daemon or tool is not installed.
var ErrNoDaemon = errors.New("overlay daemon not installed")

// CheckOverlay says what of the overlay's daemons and tools is missing on
// this machine (nil: nothing), with the fix, wrapping ErrNoDaemon.
func CheckOverlay(overlay string) error {
	var err error
	switch overlay {
	case OverlayFlanneld:
		_, _, err = flannelTools()
	case OverlayDockerd:
		_, err = dockerTools()
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoDaemon, err)
	}
	return nil
}

// overlayAdd starts container k on host h the way the overlay's runtime
// does: a CNI attachment (flanneld), `docker run` (dockerd).
func (tb *Testbed) overlayAdd(h, k int) (Container, error) {
	if tb.Config.Overlay == OverlayDockerd {
		return tb.dockerRun(h, k)
	}
	return tb.cniAdd(h, k)
}

// overlayRemove removes container ct of host h as its runtime does.
func (tb *Testbed) overlayRemove(h int, ct Container) error {
	var k int
	if _, err := fmt.Sscanf(ct.Name, "c%d", &k); err != nil {
		return fmt.Errorf("container name %q: %w", ct.Name, err)
	}
	if tb.Config.Overlay == OverlayDockerd {
		return tb.dockerRemove(h, k)
	}
	return tb.cniDel(h, k, ct)
}

// overlayIntact says whether the daemons of a testbed that Load found are
// all still running.
func (tb *Testbed) overlayIntact() bool {
	for _, d := range tb.daemons() {
		if _, ok := d.running(); !ok {
			return false
		}
	}
	return true
}

// daemons are the long-running processes of the testbed's overlay.
func (tb *Testbed) daemons() []daemon {
	switch tb.Config.Overlay {
	case OverlayFlanneld:
		return []daemon{etcdDaemon(tb.Config.Prefix), flanneldDaemon(tb.Config.Prefix, 1), flanneldDaemon(tb.Config.Prefix, 2)}
	case OverlayDockerd:
		return []daemon{dockerDaemon(tb.Config.Prefix, 1), dockerDaemon(tb.Config.Prefix, 2)}
	}
	return nil
}

// daemon is one process the testbed starts and stops; its pid file holds
// "PID STARTTIME", so a stop never signals a process that reused the PID.
type daemon struct {
	name    string // for messages: "dockerd h1"
	pidFile string
	log     string
}

// binary finds a daemon's executable: env (if set), then the paths
// given, then PATH; fix is the one-line remedy when it is missing.
func binary(env string, paths []string, name, fix string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found: %s", name, fix)
}

// start runs argv inside namespace ns as a daemon: its own session,
// output to its log, outliving lanes (the testbed stays up after `lanes
// testbed up` returns; Down stops it).
func (d daemon) start(ns string, argv []string, env []string) error {
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := nsx.Start(ns, cmd); err != nil {
		return fmt.Errorf("starting %s: %w", d.name, err)
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		return err
	}
	if err := os.WriteFile(d.pidFile, fmt.Appendf(nil, "%d %d\n", cmd.Process.Pid, st), 0o600); err != nil {
		cmd.Process.Kill()
		return err
	}
	// Reap it if it exits while this process lives; once this process
	// ends, init does.
	go cmd.Wait()
	return nil
}

// running returns the daemon's PID while the process its pid file names
// is still the one it started.
func (d daemon) running() (int, bool) {
	b, err := os.ReadFile(d.pidFile)
	if err != nil {
		return 0, false
	}
	var pid int
	var st uint64
	if n, _ := fmt.Sscan(string(b), &pid, &st); n != 2 || pid <= 0 {
		return 0, false
	}
	now, err := startTime(pid)
	if err != nil || now != st || zombie(pid) {
		return 0, false
	}
	return pid, true
}

// stop sends SIGTERM, waits up to grace for the daemon to exit, then
// kills it.
func (d daemon) stop(grace time.Duration) {
	pid, ok := d.running()
	if ok {
		syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) && !zombie(pid) {
			time.Sleep(20 * time.Millisecond)
		}
		if !zombie(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			waitGone([]int{pid}, 5*time.Second)
		}
	}
	os.Remove(d.pidFile)
}

// logTail is the end of a daemon's log, for an error message.
func (d daemon) logTail() string {
	b, _ := os.ReadFile(d.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

// startTime is a process's start time in clock ticks since boot (field 22
// of /proc/PID/stat): with the PID, it names one process for good.
func startTime(pid int) (uint64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// waitFor polls ok every 50 ms until it holds or limit passes; what says
// what was awaited, and last (if not nil) the last error seen.
func waitFor(limit time.Duration, what string, ok func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		done, err := ok()
		if done {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("%s: not after %s: %w", what, limit, last)
			}
			return fmt.Errorf("%s: not after %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// downOverlay stops what the real daemons of the testbed under prefix run
// and removes their state, from any state: with or without a saved
// testbed, daemons running or killed. Namespaces are Down's.
func downOverlay(prefix string) error {
	var errs []error
	if _, err := os.Stat(runDir(prefix)); err == nil {
		// Docker first: its containers and mounts need dockerd (or,
		// when it is gone, the cleanup below) before anything else.
		for h := 1; h <= 2; h++ {
			dockerDaemon(prefix, h).stop(10 * time.Second)
		}
		for h := 1; h <= 2; h++ {
			flanneldDaemon(prefix, h).stop(5 * time.Second)
		}
		etcdDaemon(prefix).stop(5 * time.Second)
		cleanDockerShared(prefix)
	}
	// What a killed dockerd left: shims and container processes, their
	// cgroups, and mounts (bound namespaces, overlay2 layers).
	killOwned(prefix)
	errs = append(errs, removeCgroups(prefix))
	for _, d := range []string{runDir(prefix), dataDir(prefix)} {
		errs = append(errs, unmountUnder(d))
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []string{DataDir, filepath.Dir(DataDir), RunDir, filepath.Dir(RunDir)} {
		os.Remove(d) // only when empty
	}
	return errors.Join(errs...)
}

// ownedPIDs lists the testbed's daemons and every process under them:
// those whose command line names the testbed's run or data directory
// (the daemons; containerd, which dockerd starts; the container shims,
// which containerd starts in sessions of their own, with its socket's
// path) and their descendants (the containers' processes).
func ownedPIDs(prefix string) []int {
	run, data := runDir(prefix)+"/", dataDir(prefix)+"/"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	parent := map[int]int{}
	var roots []int
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if pp, err := ppid(pid); err == nil {
			parent[pid] = pp
		}
		if cmd, err := os.ReadFile(p + "/cmdline"); err == nil && (strings.Contains(string(cmd), run) || strings.Contains(string(cmd), data)) {
			roots = append(roots, pid)
		}
	}
	owned := map[int]bool{}
	for _, r := range roots {
		owned[r] = true
	}
	// Descendants of the roots, to a fixed point.
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if owned[pp] && !owned[pid] {
				owned[pid] = true
				changed = true
			}
		}
	}
	var out []int
	for pid := range owned {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

func ppid(pid int) (int, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(raw), ')')
	f := strings.Fields(string(raw[i+1:]))
	if i < 0 || len(f) < 2 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}

// DaemonsLeft lists the processes of the testbed's real overlay still
// running (none once Down is done).
func DaemonsLeft(prefix string) []int {
	return slices.DeleteFunc(ownedPIDs(prefix), zombie)
}

func killOwned(prefix string) {
	pids := ownedPIDs(prefix)
	var socks []string
	for _, pid := range pids {
		socks = append(socks, shimSockets(pid)...)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitGone(pids, 5*time.Second)
	// A shim removes its socket when it exits cleanly; one killed
	// leaves it in containerd's shared directory.
	for _, s := range socks {
		os.Remove(s)
	}
	os.Remove(shimSocketDir)
	os.Remove(filepath.Dir(shimSocketDir))
}

// shimSocketDir is where containerd's shims bind their sockets, whatever
// containerd's own state directory.
const shimSocketDir = "/run/containerd/s"

// shimSockets lists the sockets under shimSocketDir bound in the network
// namespace of process pid (the testbed host's, where only the testbed's
// daemons run).
func shimSockets(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 8 && strings.HasPrefix(f[7], shimSocketDir+"/") {
			out = append(out, f[7])
		}
	}
	return out
}

// cgroupParent is the cgroup dockerd puts the containers of host h under
// (its cgroup-parent setting), so that a cleanup finds exactly them.
func cgroupParent(prefix string, h int) string { return fmt.Sprintf("lanes-testbed-%s-h%d", prefix, h) }

// removeCgroups removes the containers' cgroups a killed dockerd left, in
// every cgroup hierarchy mounted (v1 controllers and the unified one),
// deepest first, after killing what is still in them.
func removeCgroups(prefix string) error {
	var errs []error
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	mounts = append(mounts, "/sys/fs/cgroup")
	for h := 1; h <= 2; h++ {
		for _, m := range mounts {
			root := filepath.Join(m, cgroupParent(prefix, h))
			if _, err := os.Stat(root); err != nil {
				continue
			}
			var dirs []string
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if b, err := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs")); err == nil {
					for _, f := range strings.Fields(string(b)) {
						if pid, err := strconv.Atoi(f); err == nil {
							syscall.Kill(pid, syscall.SIGKILL)
							waitGone([]int{pid}, 2*time.Second)
						}
					}
				}
				if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dirs[i], err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder lazily unmounts every mount at or below dir (bound
// namespace files, overlay2 layers, shm), deepest first.
func unmountUnder(dir string) error {
	ms, err := mountinfo.Read()
	if err != nil {
		return err
	}
	points := mountinfo.Under(ms, dir)
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
