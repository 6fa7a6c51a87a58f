// Package netnsx resolves and enters network namespaces by the names lanes
// reports and journals them under, through nsx; a name in the pid form is
// checked, on every entry, to still stand for the namespace it was pinned
// to. A name takes one of these forms:
//
//	""                      the namespace lanes runs in
//	"NAME"                  a namespace bound under /run/netns (iproute2, testbed)
//	"/var/run/docker/netns/ID"  any bound namespace file, by absolute path (Docker)
//	"pid:N@C"               the namespace of process N, which must be the one
//	                        whose netns cookie is C (unnamed, e.g. a container
//	                        runtime's); "pid:N" unchecked, as a person types it
//	                        and as journals of builds without the cookie hold it
//
// The cookie is why the pid form is safe to keep in a journal: a PID is
// reused once its process is gone, possibly by a process of another
// container with devices of the same names, and lanes would then restore
// or adopt knobs there. A netns cookie (SO_NETNS_COOKIE) is never reused
// while the machine runs, and every entry into such a namespace checks it
// (ErrGone when it differs).
package netnsx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// ErrGone is wrapped when a namespace no longer exists, or a pid form's
// process now runs in another one. datapath/knobs' ErrGone is this error,
// so a knob whose namespace went reads as gone.
var ErrGone = errors.New("gone")

// pidForm splits a pid form into its PID and its cookie (0: none). ok is
// false for every other form, and for a pid form that does not parse.
func pidForm(ns string) (pid string, cookie uint64, ok bool) {
	rest, isPID := strings.CutPrefix(ns, "pid:")
	if !isPID {
		return "", 0, false
	}
	pid, c, hasCookie := strings.Cut(rest, "@")
	if n, err := strconv.Atoi(pid); err != nil || n <= 0 {
		return "", 0, false
	}
	if hasCookie {
		v, err := strconv.ParseUint(c, 10, 64)
		if err != nil || v == 0 {
			return "", 0, false
		}
		cookie = v
	}
	return pid, cookie, true
}

var (
	netnsName    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$`)
	procNetNSRe  = regexp.MustCompile(`^/proc/[0-9]+/(task/[0-9]+/)?ns/net$`)
	errBadNetNS  = errors.New("not a network namespace name")
	netnsFormsOK = "a name under /run/netns, the path of a bound namespace file (iproute2's, or a runtime's such as dockerd's under its exec-root), /proc/N/ns/net, or pid:N"
)

// boundPath says whether an absolute, clean path may name a namespace: a
// file that holds one (a bind mount of a namespace, an nsfs file), a
// regular file (where a runtime unmounted a namespace it had bound there:
// dockerd leaves the empty file when a container goes), or no file at
// all (a namespace that is gone, as a journal of a removed container
// names it). Entering the last two says the namespace is gone. Never a
// directory, a symlink or a device. Runtimes bind namespaces wherever
// their state lives (dockerd under its exec-root), so the test is what
// the file is, not where.
func boundPath(p string) bool {
	st, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && st.Mode().IsRegular()
}

// CheckName refuses a namespace given in none of the forms above: a
// name with a slash or a dot-dot, an unclean path, a path to a file that
// holds no namespace (a directory, a symlink, /sys/fs/bpf). A name reaches file paths (the state directory, the pin
// directory, the namespace file), so ".." would reach outside them.
func CheckName(ns string) error {
	switch {
	case ns == "":
		return nil
	case strings.HasPrefix(ns, "pid:"):
		if _, _, ok := pidForm(ns); ok {
			return nil
		}
	case filepath.IsAbs(ns):
		if filepath.Clean(ns) == ns && (procNetNSRe.MatchString(ns) || boundPath(ns)) {
			return nil
		}
	case netnsName.MatchString(ns) && ns != "." && ns != "..":
		return nil
	}
	return fmt.Errorf("netns %q: %w: give %s", ns, errBadNetNS, netnsFormsOK)
}

// Path returns the file that holds a namespace, or "" for lanes' own.
func Path(ns string) string {
	switch {
	case ns == "":
		return ""
	case strings.HasPrefix(ns, "pid:"):
		pid, _, ok := pidForm(ns)
		if !ok {
			pid = strings.TrimPrefix(ns, "pid:")
		}
		return filepath.Join("/proc", pid, "ns", "net")
	case filepath.IsAbs(ns):
		return ns
	default:
		return nsx.Path(ns)
	}
}

// NotFoundError says that namespace ns cannot be entered, and how to find
// one that can, in one line.
func NotFoundError(ns string) error {
	hint := "`ip netns list` shows the named ones"
	switch pid, cookie, ok := pidForm(ns); {
	case strings.HasPrefix(ns, "pid:") && !ok:
		hint = "want pid:N with N a process id"
	case ok && cookie != 0:
		hint = "process " + pid + " is gone or now runs in another namespace (a reused PID): give a process of the container, pid:N"
	case ok && procDenied(pid) != nil:
		hint = fmt.Sprintf("process %s runs but its namespace cannot be opened (%v): lanes needs CAP_SYS_PTRACE for a process of another user or with capabilities lanes lacks", pid, procDenied(pid))
	case ok:
		hint = "no process " + pid
	case filepath.IsAbs(ns):
		hint = "no namespace file at that path"
	}
	return fmt.Errorf("netns %q does not exist: %s", ns, hint)
}

// procDenied is the error of opening a running process's namespace file
// when the kernel refuses it (ptrace access), nil otherwise.
func procDenied(pid string) error {
	f, err := os.Open(filepath.Join("/proc", pid, "ns", "net"))
	if err == nil {
		f.Close()
	}
	if errors.Is(err, os.ErrPermission) {
		return err
	}
	return nil
}

// Exists reports whether a namespace can be entered (and, for
// "pid:N@C", is still the one with cookie C).
func Exists(ns string) bool { return checkNetNS(ns) == nil }

// nsxName turns any namespace name into one nsx accepts. nsx resolves names
// by joining them to /run/netns, so a path relative to that directory reaches
// Docker's and /proc's namespace files too; this keeps nsx the only place
// that switches threads between namespaces.
func nsxName(ns string) string {
	if pid, _, ok := pidForm(ns); ok {
		return procNetNS(pid)
	}
	if ns == "" || (!filepath.IsAbs(ns) && !strings.HasPrefix(ns, "pid:")) {
		return ns
	}
	rel, err := filepath.Rel(nsx.Dir, Path(ns))
	if err != nil {
		return ns
	}
	return rel
}

// checkNetNS returns ErrGone unless ns can be entered and, for "pid:N@C",
// is the namespace with cookie C. Callers that enter ns themselves through
// Do or DoSysfs get the cookie checked on the thread that runs their
// function; the rest (ethtool, NAPI thread lookups) rely on this check: a
// PID reused in the microseconds between it and their entry would need
// the whole PID space to wrap in between.
func checkNetNS(ns string) error {
	if err := CheckName(ns); err != nil {
		return err
	}
	_, err := EntryName(ns)
	return err
}

// EntryName is the name nsx enters for ns (nsxName), checked as
// checkNetNS says; for "pid:N@C" whose process N left the namespace,
// another process's that is still in it (relocate).
func EntryName(ns string) (string, error) {
	_, cookie, _ := pidForm(ns)
	if cookie == 0 {
		return nsxName(ns), statNetNS(ns)
	}
	var name string
	err := viaHolder(ns, cookie, func(n string) (bool, error) {
		name = n
		return false, goneNS(ns, nsx.Do(n, func() error { return checkCookie(ns, cookie) }))
	})
	return name, err
}

// relocateTries bounds how often viaHolder looks for another process of a
// namespace: each holder it found may exit before it is entered.
const relocateTries = 3

// viaHolder runs try with the nsx name of a process holding the namespace
// of pid form ns (cookie c): its own process's while that is in it, else
// another's (relocate). It tries again only while try found the namespace
// not there (errNotThere) and did nothing there (ran false: the caller's
// function has not run).
func viaHolder(ns string, c uint64, try func(name string) (ran bool, err error)) error {
	pid := holder(ns)
	ran, err := try(procNetNS(pid))
	for i := 0; i < relocateTries && !ran && errors.Is(err, errNotThere); i++ {
		next, found, rerr := relocate(c, pid)
		if rerr != nil {
			return fmt.Errorf("netns %s: looking for another process in it: %w", ns, rerr)
		}
		if !found {
			return err
		}
		pid = next
		ran, err = try(procNetNS(pid))
	}
	return err
}

// errNotThere marks a pid form's namespace not found where its label
// points (the process is gone, or in another namespace): ErrGone unless
// another process still holds the namespace (relocate).
var errNotThere = errors.New("not where its label points")

// pidHomes remembers, by netns cookie, the process through which a
// "pid:N@C" namespace is entered once N has left it.
var pidHomes sync.Map // uint64 -> string (a PID)

// holder is the process a pid form is entered through: its own, or the one
// relocate found.
func holder(ns string) string {
	pid, cookie, _ := pidForm(ns)
	if p, ok := pidHomes.Load(cookie); ok {
		return p.(string)
	}
	return pid
}

// procNetNS is the nsx name of process pid's namespace file.
func procNetNS(pid string) string {
	rel, _ := filepath.Rel(nsx.Dir, filepath.Join("/proc", pid, "ns", "net")) // two absolute paths: no error
	return rel
}

// nsCookies caches the cookies relocate read, by process and namespace
// inode: a process seen in the same namespace inode again is in the same
// namespace, so a scan enters only namespaces it has not seen. Entries of
// processes gone by the next scan are dropped.
var nsCookies = struct {
	sync.Mutex
	m map[[2]uint64]uint64 // {pid, inode} -> cookie
}{m: map[[2]uint64]uint64{}}

// relocate looks for a process in the namespace with cookie c, for a
// label whose process (tried) left it: a namespace outlives its
// first process while others hold it (a process exec'd into the
// container), and its knobs must still be restored there. It reads the
// cookie of one process of every namespace /proc shows that it has not
// read before, and remembers the holder it found. An error is one that
// kept it from reading some namespace, which then might have been c's.
func relocate(c uint64, tried string) (pid string, found bool, err error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return "", false, err
	}
	nsCookies.Lock()
	defer nsCookies.Unlock()
	live := map[[2]uint64]bool{}
	done := map[uint64]bool{} // inodes whose cookie is known this scan
	var errs []error
	for _, e := range ents {
		n, perr := strconv.ParseUint(e.Name(), 10, 64)
		if perr != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue // exited, or a kernel thread's
		}
		key := [2]uint64{n, st.Ino}
		live[key] = true
		got, known := nsCookies.m[key]
		if !known {
			if done[st.Ino] {
				continue
			}
			rerr := nsx.Do(procNetNS(e.Name()), func() (err error) { got, err = Cookie(); return err })
			if rerr != nil {
				if !errors.Is(rerr, nsx.ErrNoNetNS) {
					errs = append(errs, rerr)
				}
				continue // not marked done: another process of it may do
			}
			nsCookies.m[key] = got
		}
		done[st.Ino] = true
		if got == c && e.Name() != tried {
			pidHomes.Store(c, e.Name())
			return e.Name(), true, nil
		}
	}
	for key := range nsCookies.m {
		if !live[key] {
			delete(nsCookies.m, key)
		}
	}
	pidHomes.CompareAndDelete(c, tried)
	return "", false, errors.Join(errs...)
}

// statNetNS returns ErrGone unless ns's file is there (no cookie check).
func statNetNS(ns string) error {
	if ns == "" {
		return nil
	}
	if _, _, ok := pidForm(ns); !ok && strings.HasPrefix(ns, "pid:") {
		return fmt.Errorf("netns %s: not pid:N or pid:N@COOKIE: %w", ns, ErrGone)
	}
	if _, err := os.Stat(Path(ns)); err != nil {
		return fmt.Errorf("netns %s: %w", ns, ErrGone)
	}
	return nil
}

// goneNS marks an entry that failed because the namespace's file went away
// after it was checked (a process that exited in between) as ErrGone.
func goneNS(ns string, err error) error {
	if err != nil && errors.Is(err, nsx.ErrNoNetNS) && !errors.Is(err, ErrGone) {
		return fmt.Errorf("netns %s: %w: %w: %w", ns, ErrGone, errNotThere, err)
	}
	return err
}

// checkCookie runs on a thread inside the namespace a pid form named.
func checkCookie(ns string, want uint64) error {
	got, err := Cookie()
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("netns %s: process %s now runs in another namespace (cookie %d): %w: %w", ns, strings.TrimPrefix(strings.SplitN(ns, "@", 2)[0], "pid:"), got, ErrGone, errNotThere)
	}
	return nil
}

// Cookie is the netns cookie of the calling thread's namespace.
func Cookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for the netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie (SO_NETNS_COOKIE, Linux 5.14 and later): %w", err)
	}
	return c, nil
}

// Pin returns the form of ns to keep: "pid:N" becomes "pid:N@C" with
// the cookie of process N's namespace now; an already pinned form is
// checked; other forms are returned as they are.
func Pin(ns string) (string, error) {
	if !strings.HasPrefix(ns, "pid:") {
		return ns, nil
	}
	pid, cookie, ok := pidForm(ns)
	if !ok {
		return "", fmt.Errorf("netns %q: want pid:N with N a process id (or pid:N@COOKIE)", ns)
	}
	if cookie != 0 {
		if err := checkNetNS(ns); err != nil {
			return "", err
		}
		return ns, nil
	}
	if err := statNetNS(ns); err != nil {
		return "", fmt.Errorf("netns %s: no process %s: %w", ns, pid, ErrGone)
	}
	var c uint64
	err := goneNS(ns, nsx.Do(nsxName(ns), func() (err error) {
		c, err = Cookie()
		return err
	}))
	if err != nil {
		return "", err
	}
	return pinned(pid, c), nil
}

// pinned is the pid form of process pid's namespace with cookie c.
func pinned(pid string, c uint64) string { return "pid:" + pid + "@" + strconv.FormatUint(c, 10) }

// PinHandle is Pin for process pid's namespace as an open handle
// shows it: the cookie of the namespace h refers to, not of the one the
// process is in when its /proc file is opened again (a process may have
// switched namespaces since the caller opened it).
func PinHandle(pid int, h netns.NsHandle) (string, error) {
	var c uint64
	err := nsx.DoHandle(h, func() (err error) {
		c, err = Cookie()
		return err
	})
	if err != nil {
		return "", err
	}
	return pinned(strconv.Itoa(pid), c), nil
}

// Do runs fn on a thread inside namespace ns (see nsx.Do); /proc/sys/net
// there shows ns's settings.
func Do(ns string, fn func() error) error {
	return do(ns, false, fn)
}

// DoSysfs runs fn inside namespace ns with /sys mounted from it (see
// nsx.DoSysfs), so /sys/class/net lists ns's devices.
func DoSysfs(ns string, fn func() error) error {
	return do(ns, true, fn)
}

// DoProcSys runs fn inside namespace ns where it may write /proc/sys,
// also in a container that mounts it read-only (see nsx.DoProcSys).
func DoProcSys(ns string, fn func() error) error {
	return doWith(ns, nsx.DoProcSys, fn)
}

// SysfsAt runs fn on a thread inside namespace ns with sys, a directory
// showing ns's sysfs, for reading (see nsx.SysfsAt: nothing is mounted or
// unmounted per call, so an agent's rounds interrupt no core).
func SysfsAt(ns string, fn func(sys string) error) error {
	var sys string
	return doWith(ns, func(name string, fn func() error) error {
		return nsx.SysfsAt(name, func(root string) error { sys = root; return fn() })
	}, func() error { return fn(sys) })
}

func do(ns string, sysfs bool, fn func() error) error {
	run := nsx.Do
	if sysfs {
		run = nsx.DoSysfs
	}
	return doWith(ns, run, fn)
}

// doWith runs fn through nsxRun (an nsx function that runs its argument
// inside a named namespace) in ns, whatever form ns takes.
func doWith(ns string, nsxRun func(name string, fn func() error) error, fn func() error) error {
	if err := CheckName(ns); err != nil {
		return err
	}
	run := func(name string, fn func() error) error { return goneNS(ns, nsxRun(name, fn)) }
	if _, cookie, _ := pidForm(ns); cookie != 0 {
		// Checked on the thread that runs fn: exactly the namespace fn
		// sees. When the namespace is not there fn has not run, so it may
		// run through another of its processes; once fn ran, its own
		// errors are final.
		return viaHolder(ns, cookie, func(name string) (ran bool, err error) {
			err = run(name, func() error {
				if err := checkCookie(ns, cookie); err != nil {
					return err
				}
				ran = true
				return fn()
			})
			return ran, err
		})
	}
	if err := statNetNS(ns); err != nil {
		return err
	}
	return run(nsxName(ns), fn)
}

// Open returns a handle on namespace ns (for netlink subscriptions),
// opened on a thread that checked it is ns; the caller closes it.
func Open(ns string) (netns.NsHandle, error) {
	if ns == "" {
		return netns.Get()
	}
	h := netns.None()
	err := Do(ns, func() (err error) {
		h, err = netns.Get()
		return err
	})
	return h, err
}
