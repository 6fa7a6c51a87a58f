package knobs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/lanesnet/lanes/internal/netnsx"
)

const (
	kindSysfs   = "sysfs"
	kindProcSys = "procsys"
)

// SysfsFile is a file under /sys as seen from a network namespace, e.g.
// /sys/class/net/eth0/queues/rx-0/rps_cpus or /sys/class/net/eth0/threaded.
// sysfs shows the devices of the namespace that mounted it, so the file is
// read and written with a /sys mounted inside NetNS.
type SysfsFile struct {
	NetNS string `json:"netns,omitempty"`
	Path  string `json:"path"`
}

// Sysfs returns the knob for path (absolute, under /sys) in namespace ns.
func Sysfs(ns, path string) *SysfsFile { return &SysfsFile{NetNS: ns, Path: path} }

func (k *SysfsFile) Kind() string { return kindSysfs }
func (k *SysfsFile) Key() string  { return kindSysfs + ":" + nsLabel(k.NetNS) + ":" + k.Path }
func (k *SysfsFile) String() string {
	return nsLabel(k.NetNS) + ":" + k.Path
}

func (k *SysfsFile) Read() ([]byte, error) {
	return readIn(netnsx.DoSysfs, k.NetNS, k.Path, "/sys/", k)
}

func (k *SysfsFile) Write(v []byte) error {
	return writeIn(netnsx.DoSysfs, k.NetNS, k.Path, "/sys/", k, v)
}

// ProcSysFile is a sysctl file under /proc/sys, e.g.
// /proc/sys/net/core/rps_sock_flow_entries. /proc/sys/net follows the
// calling thread's namespace, so it is accessed from a thread inside NetNS.
type ProcSysFile struct {
	NetNS string `json:"netns,omitempty"`
	Path  string `json:"path"`
}

// ProcSys returns the knob for path (absolute, under /proc/sys) in namespace ns.
func ProcSys(ns, path string) *ProcSysFile { return &ProcSysFile{NetNS: ns, Path: path} }

// Sysctl returns the knob for a dotted sysctl name such as
// net.core.rps_sock_flow_entries.
func Sysctl(ns, name string) *ProcSysFile {
	return ProcSys(ns, "/proc/sys/"+strings.ReplaceAll(name, ".", "/"))
}

func (k *ProcSysFile) Kind() string { return kindProcSys }
func (k *ProcSysFile) Key() string  { return kindProcSys + ":" + nsLabel(k.NetNS) + ":" + k.Path }
func (k *ProcSysFile) String() string {
	return nsLabel(k.NetNS) + ":" + k.Path
}

func (k *ProcSysFile) Read() ([]byte, error) {
	return readIn(netnsx.Do, k.NetNS, k.Path, "/proc/sys/", k)
}

func (k *ProcSysFile) Write(v []byte) error {
	return writeIn(netnsx.DoProcSys, k.NetNS, k.Path, "/proc/sys/", k, v)
}

// readIn and writeIn access a file knob from a thread that enter placed in
// namespace ns: sysfs needs its own mount there (netnsx.DoSysfs), /proc/sys
// only the thread's netns (netnsx.Do), and a writable mount to write
// (netnsx.DoProcSys: a container's is read-only).
func readIn(enter func(string, func() error) error, ns, path, under string, k fmt.Stringer) ([]byte, error) {
	if err := checkPath(path, under); err != nil {
		return nil, err
	}
	var b []byte
	err := enter(ns, func() error {
		var err error
		b, err = readFile(path)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", k, err)
	}
	return b, nil
}

func writeIn(enter func(string, func() error) error, ns, path, under string, k fmt.Stringer, v []byte) error {
	if err := checkPath(path, under); err != nil {
		return err
	}
	if err := enter(ns, func() error { return writeFile(path, v) }); err != nil {
		return fmt.Errorf("writing %q to %s: %w", strings.TrimSpace(string(v)), k, err)
	}
	return nil
}

func nsLabel(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}

func checkPath(p, under string) error {
	if !strings.HasPrefix(p, under) || filepath.Clean(p) != p {
		return fmt.Errorf("knob path %q must be a clean absolute path under %s", p, under)
	}
	return nil
}

func readFile(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
		return nil, fmt.Errorf("%w: %w", ErrGone, err)
	}
	return b, err
}

// writeFile writes v with a single write(2): sysfs and sysctl handlers parse
// one buffer per write, so a split write would set a truncated value.
func writeFile(p string, v []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
			return fmt.Errorf("%w: %w", ErrGone, err)
		}
		return err
	}
	n, werr := f.Write(v)
	cerr := f.Close()
	if werr != nil {
		if errors.Is(werr, syscall.ENODEV) {
			return fmt.Errorf("%w: %w", ErrGone, werr)
		}
		return werr
	}
	if n != len(v) {
		return fmt.Errorf("short write: %d of %d bytes", n, len(v))
	}
	return cerr
}
