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
// sits in a directory others may write (also at the end of a symlink) is
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

// A Kubernetes ConfigMap volume is a directory of mode 0777 mounted
// read-only into the pod: nobody can write there, so it passes.
func TestLoadReadOnlyMount(t *testing.T) {
	testenv.Root(t)
	d := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", d, "tmpfs", 0, "mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
	p := filepath.Join(d, "lanes.yaml")
	if err := os.WriteFile(p, []byte("mode: rps\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil {
		t.Fatal("premise: a 0666 file in a writable 0777 directory is refused")
	}
	if err := unix.Mount("", d, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err != nil {
		t.Errorf("the same file on a read-only mount: %v", err)
	}
}
