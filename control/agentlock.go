package control

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/netnsx"
	"golang.org/x/sys/unix"
)

// AgentLockFile is the file in a target's state directory on which its
// agent holds an exclusive flock for as long as it lives, its PID written
// in it. Whether an agent runs is whether the lock is held, asked in one
// step (a try of the lock): two agents started at once cannot both see
// none, and the kernel drops the lock of an agent that dies, however it
// dies. lanes apply and reset hold it shared while they change the target,
// so they never run beside an agent, nor an agent starts beside them.
const AgentLockFile = "agent.lock"

// agentLocks are the state directories whose agent lock this process
// holds: its own apply and reset (lanes agent --config applying its
// file, resetting on exit) work beside it.
var agentLocks = struct {
	sync.Mutex
	dirs map[string]bool
}{dirs: map[string]bool{}}

func ownAgentLock(dir string) bool {
	agentLocks.Lock()
	defer agentLocks.Unlock()
	return agentLocks.dirs[filepath.Clean(dir)]
}

// agentLockPoll is how often LockAgent tries again while an apply or a
// reset holds the lock.
const agentLockPoll = 50 * time.Millisecond

// AgentLock is a running agent's hold on its target (LockAgent).
type AgentLock struct {
	f                     *os.File
	dir, stateDir, target string
}

// LockAgent takes the agent lock of netns's target for this process, or
// fails naming the agent that holds it. A lanes apply or reset holding it
// for a moment is waited for, up to lockWait. The target's state directory
// is made when there is none.
func LockAgent(stateDir, netns string) (*AgentLock, error) {
	if err := netnsx.CheckName(netns); err != nil {
		return nil, err
	}
	dir := Dir(stateDir, netns)
	path := filepath.Join(dir, AgentLockFile)
	for deadline := time.Now().Add(lockWait); ; time.Sleep(agentLockPoll) {
		f, err := openAgentLock(dir, true)
		if err != nil {
			return nil, err
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			if !knobs.StillAt(f, path) {
				// A reset removed it while we waited: the one there now
				// (or none) is what counts.
				f.Close()
				continue
			}
			return lockedAgent(f, dir, stateDir, netns)
		}
		pid, agent := lockHolder(f)
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if agent && pid > 0 {
			return nil, fmt.Errorf("an agent (pid %d) already runs for netns %s: stop it first (systemctl stop lanes, or kill %d)", pid, label(netns), pid)
		}
		if time.Now().After(deadline) {
			if agent {
				return nil, fmt.Errorf("another agent is starting for netns %s: stop it first (systemctl stop lanes)", label(netns))
			}
			return nil, fmt.Errorf("state dir %s is in use by a lanes apply or reset: start the agent once it is done (%w)", dir, knobs.ErrBusy)
		}
	}
}

// lockedAgent records this process's PID in the lock it holds, for
// whoever finds it held.
func lockedAgent(f *os.File, dir, stateDir, netns string) (*AgentLock, error) {
	err := f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the agent's pid into %s: %w", f.Name(), err)
	}
	agentLocks.Lock()
	agentLocks.dirs[filepath.Clean(dir)] = true
	agentLocks.Unlock()
	return &AgentLock{f: f, dir: dir, stateDir: stateDir, target: Target(netns)}, nil
}

// openAgentLock opens dir's agent lock file, making it (and, with mkdir,
// dir) where there is none; not through a symlink. Both are their
// owner's alone (0700, 0600): a flock needs no more than a read-only
// open, and anyone who could open the file could hold it and make apply,
// reset and the agent refuse the target.
func openAgentLock(dir string, mkdir bool) (*os.File, error) {
	if mkdir {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating state dir: %w", err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, AgentLockFile), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the agent lock (not a symlink): %w", err)
	}
	return f, nil
}

// lockHolder tells, for a lock file whose exclusive lock could not be
// taken, whether an agent holds it (exclusive; apply and reset hold it
// shared) and the PID it wrote. An agent that has just taken it may not
// have written its PID yet (0, or a dead one's).
func lockHolder(f *os.File) (pid int, agent bool) {
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return 0, false
	}
	b := make([]byte, 16)
	n, _ := f.ReadAt(b, 0)
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b[:n])))
	// EPERM: alive, and someone else's.
	if err := unix.Kill(pid, 0); pid <= 0 || err != nil && !errors.Is(err, unix.EPERM) {
		pid = 0
	}
	return pid, true
}

// Close lets go of the lock: its file is removed (still the one held: a
// reset of this process's may have removed it already), then the target's
// state directory if that leaves it empty, under the journal's lock.
func (l *AgentLock) Close() error {
	agentLocks.Lock()
	delete(agentLocks.dirs, filepath.Clean(l.dir))
	agentLocks.Unlock()
	path := filepath.Join(l.dir, AgentLockFile)
	if knobs.StillAt(l.f, path) {
		os.Remove(path)
	}
	err := l.f.Close()
	if j, jerr := knobs.OpenExisting(l.dir, l.target); jerr == nil {
		os.Remove(l.dir) // only when empty
		j.Close()
	}
	removeDefaultDir(l.stateDir)
	return err
}

// holdAgentOff holds dir's agent lock shared until release, so that no
// agent runs while an apply or reset (what) changes the target, or fails
// naming the agent that runs: the agent works for the applied plan, and
// would go on placing flows and switching knobs for one that is gone (its
// runtime writes check the journal's generation, knobs.RuntimeWrite, but
// its maps and placement would follow the old plan's). Without mkdir a
// missing dir holds nothing (no state: no agent). This process's own agent
// is no obstacle.
func holdAgentOff(dir, what string, mkdir bool) (release func(), err error) {
	none := func() {}
	if ownAgentLock(dir) {
		return none, nil
	}
	for {
		if !mkdir {
			if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
				return none, nil
			}
		}
		f, err := openAgentLock(dir, mkdir)
		if err != nil {
			return nil, err
		}
		if testAgentLockOpened != nil {
			testAgentLockOpened()
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
			pid, _ := lockHolder(f)
			f.Close()
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
			}
			if pid == 0 {
				return nil, fmt.Errorf("lanes agent is starting for %s: stop it first, then %s again", filepath.Base(dir), what)
			}
			return nil, fmt.Errorf("lanes agent (pid %d) runs for %s: stop it first (kill %d), then %s again", pid, filepath.Base(dir), pid, what)
		}
		if knobs.StillAt(f, filepath.Join(dir, AgentLockFile)) {
			return func() { f.Close() }, nil
		}
		// A reset removed it between the open and the lock: an agent
		// would take the one there now (or made next) beside us.
		f.Close()
	}
}

// testAgentLockOpened, when set, runs in holdAgentOff between the open of
// the agent lock and its flock.
var testAgentLockOpened func()
