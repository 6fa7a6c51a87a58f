package netnsx_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
)

// Namespace names reach file paths (state and pin directories, namespace
// files): only the documented forms are taken.
func TestCheckName(t *testing.T) {
	for _, ok := range []string{"", "lanes-h1", "h2.x", "pid:12", "pid:12@99", "/run/netns/lanes-h1", "/var/run/netns/x",
		"/var/run/docker/netns/1-abc", "/run/docker/netns/c0ffee", "/proc/42/ns/net", "/proc/42/task/43/ns/net"} {
		if err := netnsx.CheckName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"..", ".", "../etc", "a/b", "/etc", "/run/netns/../../etc", "/run/netns/", "/proc/self/ns/net",
		"/proc/42/ns/mnt", "pid:x", "pid:-1", "pid:1@0", "-flag", "/var/run/docker/../../../etc/x"} {
		if err := netnsx.CheckName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error on more than one line: %q", bad, err)
		}
	}
	// Any path naming a bound namespace file, wherever a runtime keeps
	// it (dockerd under its exec-root), or the empty file left where it
	// unbound one; never a directory or a symlink.
	dir := t.TempDir()
	file, link := filepath.Join(dir, "netns"), filepath.Join(dir, "link")
	os.WriteFile(file, nil, 0o600)
	os.Symlink(file, link)
	if err := netnsx.CheckName(file); err != nil {
		t.Errorf("an unbound namespace file %s refused: %v", file, err)
	}
	for _, bad := range []string{dir, link} {
		if err := netnsx.CheckName(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if os.Geteuid() == 0 && !testing.Short() {
		// A bound namespace needs root and creates one: an
		// integration check, not a unit one (make unit runs -short).
		name := "lanes-cnn-" + strconv.Itoa(os.Getpid())
		if err := nsx.Create(name); err != nil {
			t.Fatal(err)
		}
		defer nsx.Delete(name)
		bound := filepath.Join(t.TempDir(), "exec-root-netns")
		os.WriteFile(bound, nil, 0o600)
		if err := unix.Mount(nsx.Path(name), bound, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		defer unix.Unmount(bound, unix.MNT_DETACH)
		if err := netnsx.CheckName(bound); err != nil {
			t.Errorf("a namespace bound at %s refused: %v", bound, err)
		}
	}
}
