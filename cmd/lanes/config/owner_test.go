package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/internal/testenv"
	"golang.org/x/sys/unix"
)

// A file that another user owns, that group or others may write, or that
// sits below a directory others may write (its own or one further up,
// also at the end of a symlink) is
// refused before it is read, in one line saying how to fix it; the same
// file in a directory that lets nobody replace it is read.
func TestLoadOwnerAndMode(t *testing.T) {
	const src = "mode: rps\n"
	file := func(dir string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, "lanes.yaml")
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dir := func(mode os.FileMode) string {
		t.Helper()
		d := filepath.Join(t.TempDir(), "etc")
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	ok := file(dir(0o755), 0o644)
	if _, err := Load(ok); err != nil {
		t.Fatalf("premise: a file of lanes' user, mode 0644, in a 0755 directory loads: %v", err)
	}
	ancestor := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(ancestor, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ancestor, 0o777); err != nil {
		t.Fatal(err)
	}
	below := filepath.Join(ancestor, "etc")
	if err := os.Mkdir(below, 0o755); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(dir(0o755), "lanes.yaml")
	if err := os.Symlink(file(dir(0o777), 0o644), linked); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, want string
	}{
		{"group-writable file", file(dir(0o755), 0o664), "has mode 0664: group or others may write it"},
		{"world-writable file", file(dir(0o755), 0o646), "chmod go-w"},
		{"world-writable directory", file(dir(0o777), 0o644), "its directory"},
		{"group-writable directory", file(dir(0o775), 0o644), "has mode 0775"},
		{"symlink into a world-writable directory", linked, "its directory"},
		{"world-writable ancestor", file(below, 0o644), "its directory " + ancestor + " has mode 0777"},
	}
	if os.Geteuid() == 0 {
		other := file(dir(0o755), 0o644)
		if err := os.Chown(other, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		otherDir := dir(0o755)
		p := file(otherDir, 0o644)
		if err := os.Chown(otherDir, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		cases = append(cases,
			struct{ name, path, want string }{"file of another user", other, "owned by uid 1000, not by root or lanes' user"},
			struct{ name, path, want string }{"directory of another user", p, "its directory"})
	}
	for _, c := range cases {
		_, err := Load(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line saying %q", c.name, err, c.want)
			continue
		}
		var ec interface{ ExitCode() int }
		if !errors.As(err, &ec) || ec.ExitCode() != ExitConfig {
			t.Errorf("%s: %v exits with no %d", c.name, err, ExitConfig)
		}
	}
	// /tmp's kind: others may write the directory, but not replace a file
	// they do not own.
	if _, err := Load(file(dir(os.ModeSticky|0o777), 0o644)); err != nil {
		t.Errorf("a file in a sticky directory: %v", err)
	}
}

// A Kubernetes ConfigMap volume (the kubelet's layout: the file in a
// version directory that ..data names, at the root of a read-only mount
// whose root is mode 0777) passes; a file that is only on a read-only
// mount, but writable through its source, is refused: a 0666 file on a
// read-only tmpfs or bind-mounted read-only, one in a version directory
// ..data does not name, a ConfigMap's layout below the mount's root.
func TestLoadKubeVolume(t *testing.T) {
	testenv.Root(t)
	tmp := t.TempDir()
	mkdir := func(d string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	write := func(p string, mode os.FileMode) string {
		t.Helper()
		if err := os.WriteFile(p, []byte("mode: rps\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	symlink := func(old, new string) {
		t.Helper()
		if err := os.Symlink(old, new); err != nil {
			t.Fatal(err)
		}
	}
	// configMap lays out the kubelet's volume in vol: lanes.yaml -> ..data/lanes.yaml,
	// ..data -> the version directory, the file mode in it.
	configMap := func(vol string, mode os.FileMode) string {
		const ts = "..2006_01_02_15_04_05.123456"
		mkdir(filepath.Join(vol, ts), 0o755)
		write(filepath.Join(vol, ts, "lanes.yaml"), mode)
		symlink(ts, filepath.Join(vol, "..data"))
		symlink("..data/lanes.yaml", filepath.Join(vol, "lanes.yaml"))
		return filepath.Join(vol, "lanes.yaml")
	}
	vol := mkdir(filepath.Join(tmp, "vol"), 0o755)
	if err := unix.Mount("tmpfs", vol, "tmpfs", 0, "mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(vol, unix.MNT_DETACH) })
	kube := configMap(vol, 0o644)
	stale := write(filepath.Join(mkdir(filepath.Join(vol, "..2006_01_02_15_04_04.1"), 0o755), "lanes.yaml"), 0o666)
	plain := write(filepath.Join(vol, "plain.yaml"), 0o666)
	deep := configMap(mkdir(filepath.Join(vol, "sub"), 0o777), 0o644)
	if _, err := Load(kube); err == nil {
		t.Fatal("premise: a ConfigMap's layout on a writable mount of mode 0777 is refused")
	}
	if err := unix.Mount("", vol, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(kube); err != nil {
		t.Errorf("a ConfigMap volume: %v", err)
	}
	src := write(filepath.Join(mkdir(filepath.Join(tmp, "src"), 0o755), "lanes.yaml"), 0o666)
	bound := write(filepath.Join(mkdir(filepath.Join(tmp, "dst"), 0o755), "lanes.yaml"), 0o644)
	if err := unix.Mount(src, bound, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(bound, unix.MNT_DETACH) })
	if err := unix.Mount("", bound, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path, want string }{
		{"a 0666 file on a read-only tmpfs", plain, "has mode 0666"},
		{"a 0666 file bind-mounted read-only", bound, "has mode 0666"},
		{"a version directory ..data does not name", stale, "has mode 0666"},
		{"a ConfigMap's layout below the mount's root", deep, "has mode 0777"},
	} {
		if _, err := Load(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
