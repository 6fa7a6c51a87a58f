// Package nsx runs code and commands inside named network namespaces.
//
// Go schedules goroutines over OS threads, and a network namespace belongs to
// a thread, so every entry point here locks a fresh goroutine to its thread,
// switches that thread, and lets the thread die afterwards instead of handing
// a thread in a foreign namespace back to the scheduler.
//
// Named namespaces are the files under /run/netns that iproute2 and the
// testbed create, or any bound namespace file given by its absolute path
// (a container runtime's, such as dockerd's under its exec-root); the empty
// name means the namespace lanes was started in.
package nsx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The main goroutine stays on the main thread for the life of the process.
// Do leaves a thread it moved into another namespace to die with its
// goroutine; if that were the main thread, Go could not end it and would
// park it, still in the foreign namespace, and Linux reports the main
// thread's namespace as the whole process's (/proc/self/net, /proc/PID/ns).
func init() { runtime.LockOSThread() }

// Dir is where named network namespaces are bound (iproute2's convention).
const Dir = "/run/netns"

// Path returns the bind-mount path of a named namespace: an absolute name
// is its own path.
func Path(name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(Dir, name)
}

// Exists reports whether a named namespace is present.
func Exists(name string) bool {
	if name == "" {
		return true
	}
	h, err := open(name)
	if err != nil {
		return false
	}
	h.Close()
	return true
}

// open opens a bound namespace file, and fails with ErrNoNetNS when the
// file is not there or no longer holds a namespace: a runtime that
// unmounts a namespace's bind mount may leave the empty file behind
// (dockerd does, under its exec-root).
func open(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromPath(Path(name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return h, fmt.Errorf("opening netns %s: %w: %w", name, ErrNoNetNS, err)
		}
		return h, fmt.Errorf("opening netns %s: %w", name, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil {
		h.Close()
		return netns.None(), fmt.Errorf("opening netns %s: %w", name, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		h.Close()
		return netns.None(), fmt.Errorf("opening netns %s: %w: the file holds no namespace (its bind mount is gone)", name, ErrNoNetNS)
	}
	return h, nil
}

// Create makes a named namespace (no-op when it exists) without leaving the
// calling thread in it.
func Create(name string) error {
	if Exists(name) {
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left in the new namespace: never unlock, so the
		// runtime discards it when this goroutine ends.
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("creating netns %s: %w", name, err)
	}
	return nil
}

// Delete removes a named namespace; a missing one is not an error.
func Delete(name string) error {
	if !Exists(name) {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting netns %s: %w", name, err)
	}
	return nil
}

// List returns the named namespaces whose names start with prefix.
func List(prefix string) []string {
	ents, _ := os.ReadDir(Dir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Do runs fn on a thread inside the named namespace.
func Do(name string, fn func() error) error {
	return do(name, false, false, fn)
}

// DoSysfs runs fn inside the named namespace with a private mount namespace
// whose /sys is mounted from within it, so /sys/class/net shows that
// namespace's devices (what `ip netns exec` does). /proc/sys/net follows the
// thread's netns already; /sys does not, because sysfs binds its view at mount.
func DoSysfs(name string, fn func() error) error {
	return do(name, true, false, fn)
}

// DoProcSys runs fn inside the named namespace where it may write
// /proc/sys. A container runtime mounts the container's /proc/sys
// read-only (runc's readonly paths), a bind mount no volume may replace;
// there fn runs in a private mount namespace whose copy of that mount is
// made writable. The runtime's mount keeps its read-only flag: only
// lanes' private copy, which no other process sees, can write.
func DoProcSys(name string, fn func() error) error {
	var st unix.Statfs_t
	if err := unix.Statfs("/proc/sys", &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
		return Do(name, fn)
	}
	return do(name, false, true, func() error {
		if err := privateMounts(); err != nil {
			return err
		}
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND)
		for _, f := range []struct{ st, ms uintptr }{{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC}} {
			if uintptr(st.Flags)&f.st != 0 {
				flags |= f.ms
			}
		}
		if err := unix.Mount("", "/proc/sys", "", flags, ""); err != nil {
			return fmt.Errorf("/proc/sys is read-only (a container runtime mounted it so) and could not be made writable: %w", err)
		}
		return fn()
	})
}

// privateMounts gives the calling (locked, discarded) thread a mount
// namespace of its own, whose changes reach no other.
func privateMounts() error {
	// CLONE_FS first: Go's threads share one fs_struct, and a new
	// mount namespace needs a private one.
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	return nil
}

// do runs fn inside the named namespace, with /sys mounted from it with
// sysfs; on a thread of its own, which is discarded after, unless fn
// needs none (lanes' own namespace, no mounts, not thread).
func do(name string, sysfs, thread bool, fn func() error) error {
	if name == "" && !sysfs && !thread {
		return fn()
	}
	policy := callerPolicy()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Thread state changes below are never undone: the locked thread
		// exits with the goroutine (we do not call UnlockOSThread).
		errc <- func() error {
			if err := takePolicy(policy); err != nil {
				return err
			}
			if sysfs {
				if err := privateMounts(); err != nil {
					return err
				}
			}
			if name != "" {
				h, err := open(name)
				if err != nil {
					return err
				}
				defer h.Close()
				if err := netns.Set(h); err != nil {
					return fmt.Errorf("entering netns %s: %w", name, err)
				}
			}
			if sysfs {
				_ = unix.Unmount("/sys", unix.MNT_DETACH)
				if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
					return fmt.Errorf("mounting sysfs for netns %s: %w", name, err)
				}
				return writableSysfs(name, fn)
			}
			return fn()
		}()
	}()
	return <-errc
}

// writableSysfs runs fn with the sysfs just mounted on /sys writable.
//
// A namespace has one sysfs superblock, shared by every mount of it, and
// its first mounter's flags stay with it: a container runtime that mounts
// the container's /sys read-only (Docker, runc) makes the superblock
// read-only, and lanes' own mount of it then refuses every write (EROFS).
// For such a superblock fn runs with it reconfigured read-write and then
// put back read-only. The runtime's mount keeps its own read-only mount
// flag throughout, so the container never gets write access; only lanes'
// private mount, which no other process sees, can write in between.
// sysfsRW serialises these windows within the process, so one caller
// never turns the superblock read-only under another's write.
func writableSysfs(name string, fn func() error) error {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys", &st); err != nil {
		return fmt.Errorf("statfs of sysfs for netns %s: %w", name, err)
	}
	if st.Flags&unix.ST_RDONLY == 0 {
		return fn()
	}
	sysfsRW.Lock()
	defer sysfsRW.Unlock()
	if err := unix.Mount("", "/sys", "", unix.MS_REMOUNT, ""); err != nil {
		return fmt.Errorf("sysfs of netns %s is read-only (a container runtime mounted it so) and could not be made writable: %w", name, err)
	}
	ferr := fn()
	if err := unix.Mount("", "/sys", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return errors.Join(ferr, fmt.Errorf("putting the sysfs of netns %s back read-only: %w", name, err))
	}
	return ferr
}

var sysfsRW sync.Mutex

// ErrNoNetNS is wrapped by Do and DoSysfs when the namespace's file is
// not there (a name no longer bound, a process that exited), as opposed
// to an error of the function they run.
var ErrNoNetNS = errors.New("no such network namespace")

// DoHandle runs fn on a thread inside the namespace an open handle refers
// to (one a caller already checked, so that fn sees exactly that one).
func DoHandle(h netns.NsHandle, fn func() error) error {
	policy := callerPolicy()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left in h's namespace: never unlock, so the
		// runtime discards it when this goroutine ends.
		if err := takePolicy(policy); err != nil {
			errc <- err
			return
		}
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("entering netns %s: %w", h, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Start starts cmd inside the named namespace: the child is forked from a
// thread that has entered it, and inherits it.
func Start(name string, cmd *exec.Cmd) error {
	return Do(name, cmd.Start)
}

// Output runs argv inside the named namespace and returns its stdout; on
// failure the error carries stderr.
func Output(name string, argv ...string) ([]byte, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	var out []byte
	err := Do(name, func() error {
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		return out, fmt.Errorf("%s (netns %q): %w: %s", strings.Join(argv, " "), name, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// callerPolicy is the calling thread's scheduling attributes when its
// policy is not SCHED_NORMAL, else nil. A goroutine that set another policy
// on its thread has locked itself to it (kthread.OnThread), so its work in a
// namespace, on the fresh thread do locks, must run at the same policy: a
// SCHED_IDLE background round whose namespace hops ran at normal policy
// would take the core from the receive path it means to leave alone. An
// unlocked goroutine runs on a thread the runtime made, at SCHED_NORMAL.
func callerPolicy() *unix.SchedAttr {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil || a.Policy == unix.SCHED_NORMAL {
		return nil
	}
	return a
}

// takePolicy gives the calling (locked, fresh) thread the attributes
// callerPolicy read, if any.
func takePolicy(a *unix.SchedAttr) error {
	if a == nil {
		return nil
	}
	b := *a
	b.Size = unix.SizeofSchedAttr
	b.Flags = 0
	if err := unix.SchedSetAttr(0, &b, 0); err != nil {
		return fmt.Errorf("giving the namespace's thread its caller's scheduling policy %d: %w", a.Policy, err)
	}
	return nil
}

// SysfsAt runs fn on a thread inside the named namespace ("" for the
// process's own) with sys, a directory that shows that namespace's sysfs:
// sys+"/class/net" lists its devices. It is for reading: fn must not write
// there (DoSysfs is for writes).
//
// sys is a detached sysfs mount (fsopen, fsmount: no mount namespace, no
// mount point) made the first time a namespace is asked for and kept while
// it is asked for again within sysfsKeep, under /proc/self/fd. DoSysfs
// instead unshares a mount namespace and mounts sysfs on every call, and
// every unmount (its own, and the namespace's at thread exit) waits for
// an expedited RCU grace period, which interrupts every busy core: an
// agent that reads a host's namespaces every second would interrupt the
// receive path it steers several times a second. A kept mount holds no
// more than a passive reference on its namespace: the namespace's devices
// still go when it dies. Where the kernel lacks the mount API (< 5.2) or
// the netns cookie (< 5.14), it falls back to DoSysfs with sys "/sys".
func SysfsAt(name string, fn func(sys string) error) error {
	fallback := false
	err := do(name, false, false, func() error {
		root, release, err := sysfsRoot()
		if errors.Is(err, errNoDetachedSysfs) {
			fallback = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("sysfs of netns %s: %w", name, err)
		}
		defer release()
		return fn(root)
	})
	if fallback {
		return DoSysfs(name, func() error { return fn("/sys") })
	}
	return err
}

// sysfsKeep is how long a namespace's detached sysfs mount is kept after
// its last use; a namespace read every round keeps its mount for good.
var sysfsKeep = 10 * time.Second

var errNoDetachedSysfs = errors.New("no detached sysfs mounts here")

// sysfsMounts are the detached sysfs mounts by netns cookie (cookies are
// never reused, unlike namespace inode numbers).
var sysfsMounts = struct {
	sync.Mutex
	byCookie map[uint64]*sysfsMount
	none     bool // the kernel cannot make them: DoSysfs it is
}{byCookie: map[uint64]*sysfsMount{}}

type sysfsMount struct {
	fd    int
	used  time.Time
	users int // callers reading through it now: never closed under them
}

// sysfsRoot is the root of the calling thread's namespace's sysfs, held
// until release; mounts nobody held for sysfsKeep are let go on the way
// (their fd numbers are reused once closed).
func sysfsRoot() (root string, release func(), err error) {
	m := &sysfsMounts
	m.Lock()
	defer m.Unlock()
	if m.none {
		return "", nil, errNoDetachedSysfs
	}
	cookie, err := threadCookie()
	if err != nil {
		m.none = true
		return "", nil, errNoDetachedSysfs
	}
	now := time.Now()
	for c, s := range m.byCookie {
		if c != cookie && s.users == 0 && now.Sub(s.used) > sysfsKeep {
			unix.Close(s.fd)
			delete(m.byCookie, c)
		}
	}
	s, ok := m.byCookie[cookie]
	if !ok {
		fd, err := mountSysfs()
		if errors.Is(err, unix.ENOSYS) {
			m.none = true
			return "", nil, errNoDetachedSysfs
		}
		if err != nil {
			return "", nil, err
		}
		s = &sysfsMount{fd: fd}
		m.byCookie[cookie] = s
	}
	s.users++
	return "/proc/self/fd/" + strconv.Itoa(s.fd), func() {
		m.Lock()
		defer m.Unlock()
		s.users--
		s.used = time.Now()
	}, nil
}

// mountSysfs makes a detached, read-only sysfs mount of the calling
// thread's network namespace (sysfs takes the namespace of whoever
// creates it).
func mountSysfs() (int, error) {
	fs, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen sysfs: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("creating a sysfs superblock: %w", err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount sysfs: %w", err)
	}
	return fd, nil
}

// threadCookie is the cookie of the calling thread's network namespace.
func threadCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}
