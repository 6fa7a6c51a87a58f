package knobs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Network namespaces are named the way topology reports them:
//
//	""                      the namespace lanes runs in
//	"NAME"                  a namespace bound under /run/netns (iproute2, testbed)
//	"/var/run/docker/netns/ID"  any bound namespace file, by absolute path (Docker)
//	"pid:N"                 the namespace of process N (unnamed, e.g. a container runtime's)

// NetNSPath returns the file that holds a namespace, or "" for lanes' own.
func NetNSPath(ns string) string {
	switch {
	case ns == "":
		return ""
	case strings.HasPrefix(ns, "pid:"):
		return filepath.Join("/proc", strings.TrimPrefix(ns, "pid:"), "ns", "net")
	case filepath.IsAbs(ns):
		return ns
	default:
		return nsx.Path(ns)
	}
}

// NetNSExists reports whether a namespace can be entered.
func NetNSExists(ns string) bool {
	if ns == "" {
		return true
	}
	if strings.HasPrefix(ns, "pid:") {
		if _, err := strconv.Atoi(strings.TrimPrefix(ns, "pid:")); err != nil {
			return false
		}
	}
	_, err := os.Stat(NetNSPath(ns))
	return err == nil
}

// nsxName turns any namespace name into one nsx accepts. nsx resolves names
// by joining them to /run/netns, so a path relative to that directory reaches
// Docker's and /proc's namespace files too; this keeps nsx the only place
// that switches threads between namespaces.
func nsxName(ns string) string {
	if ns == "" || (!filepath.IsAbs(ns) && !strings.HasPrefix(ns, "pid:")) {
		return ns
	}
	rel, err := filepath.Rel(nsx.Dir, NetNSPath(ns))
	if err != nil {
		return ns
	}
	return rel
}

func checkNetNS(ns string) error {
	if !NetNSExists(ns) {
		return fmt.Errorf("netns %s: %w", ns, ErrGone)
	}
	return nil
}

// Do runs fn on a thread inside namespace ns (see nsx.Do); /proc/sys/net
// there shows ns's settings.
func Do(ns string, fn func() error) error {
	if err := checkNetNS(ns); err != nil {
		return err
	}
	return nsx.Do(nsxName(ns), fn)
}

// DoSysfs runs fn inside namespace ns with /sys mounted from it (see
// nsx.DoSysfs), so /sys/class/net lists ns's devices.
func DoSysfs(ns string, fn func() error) error {
	if err := checkNetNS(ns); err != nil {
		return err
	}
	return nsx.DoSysfs(nsxName(ns), fn)
}
