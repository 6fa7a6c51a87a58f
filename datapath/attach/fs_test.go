package attach_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestBPFFS(t *testing.T) {
	testenv.Root(t)
	if k := (&attach.BPFFS{}); k.Key() != "bpffs-mount:/sys/fs/bpf" {
		t.Errorf("default key %q", k.Key())
	}
	mnt := filepath.Join(t.TempDir(), "a", "bpf")
	trackMount(t, mnt)
	k := &attach.BPFFS{Path: mnt}
	wantRead(t, k, "")
	write(t, k, "") // nothing mounted, nothing to do
	write(t, k, attach.ValueMounted)
	wantRead(t, k, attach.ValueMounted)
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Fatalf("statfs %s: type %#x, %v", mnt, st.Type, err)
	}
	write(t, k, attach.ValueMounted)
	if n := countMounts(mnt); n != 1 {
		t.Fatalf("%d mounts at %s, want 1", n, mnt)
	}
	jsonRoundTrip(t, k, &attach.BPFFS{})

	// A directory inside the bpffs is on one, but is not lanes' to unmount.
	sub := &attach.BPFFS{Path: filepath.Join(mnt, "sub")}
	if err := os.Mkdir(sub.Path, 0o700); err != nil {
		t.Fatal(err)
	}
	wantRead(t, sub, attach.ValueMounted)
	if err := sub.Write(nil); err == nil || !strings.Contains(err.Error(), "not unmounting") {
		t.Errorf("unmounting a subdirectory: %v", err)
	}

	write(t, k, "")
	wantRead(t, k, "")
	if n := countMounts(mnt); n != 0 {
		t.Fatalf("%d mounts left at %s", n, mnt)
	}
	write(t, k, "")

	if err := (&attach.BPFFS{Path: "rel/path"}).Write([]byte(attach.ValueMounted)); err == nil {
		t.Error("mounting on a relative path succeeded")
	}
}

func TestPinDir(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	k := &attach.PinDir{Path: filepath.Join(fs, "lanes", "host")}
	if k.Key() != "bpf-pins:"+k.Path {
		t.Errorf("key %q", k.Key())
	}
	wantRead(t, k, "")
	write(t, k, "")
	write(t, k, attach.ValuePresent)
	wantRead(t, k, attach.ValuePresent)
	write(t, k, attach.ValuePresent)
	jsonRoundTrip(t, k, &attach.PinDir{})

	// What a loader leaves: programs, a map, a subdirectory.
	pinProgs(t, k.Path)
	if err := os.Mkdir(filepath.Join(k.Path, "maps"), 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(filepath.Join(k.Path, "maps", "m")); err != nil {
		t.Fatal(err)
	}
	m.Close()

	write(t, k, "")
	wantRead(t, k, "")
	gone(t, k.Path)
	gone(t, filepath.Join(fs, "lanes")) // the last pin dir out takes its empty parent

	// The datapath's own unpin removes its pin dir before this knob is
	// restored: the empty parent still goes.
	write(t, k, attach.ValuePresent)
	if err := os.Remove(k.Path); err != nil {
		t.Fatal(err)
	}
	write(t, k, "")
	gone(t, filepath.Join(fs, "lanes"))

	// The same through a journal, as `lanes reset` restores it: the pin
	// dir is gone, so the knob holds its original and is not written;
	// the empty parent still goes.
	j, err := knobs.Open(filepath.Join(t.TempDir(), "state"), "host")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Set(k, []byte(attach.ValuePresent)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(k.Path); err != nil {
		t.Fatal(err)
	}
	if rep, err := j.Restore(); err != nil {
		t.Fatalf("reset: %v (%+v)", err, rep)
	}
	j.Close()
	gone(t, filepath.Join(fs, "lanes"))

	// A bpffs mounted inside the pin dir is someone else's.
	write(t, k, attach.ValuePresent)
	inner := filepath.Join(k.Path, "inner")
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", inner, "bpf", 0, ""); err != nil {
		t.Fatal(err)
	}
	trackMount(t, inner)
	innerPin := filepath.Join(inner, "p")
	pinProg(t, ebpf.XDP, "inner", innerPin)
	if err := k.Write(nil); err == nil || !strings.Contains(err.Error(), "another mount") {
		t.Errorf("removing across a mount: %v", err)
	}
	exists(t, innerPin)
	if err := unix.Unmount(inner, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	write(t, k, "")
	gone(t, k.Path)
}

// A pin dir lanes did not make (another owner), or one others may write
// in, is refused: whoever can write there can swap lanes' pins.
func TestPinDirOwnerAndMode(t *testing.T) {
	testenv.Root(t)
	fs := testBPFFS(t)
	k := &attach.PinDir{Path: filepath.Join(fs, "lanes", "host")}
	write(t, k, attach.ValuePresent)
	for _, c := range []struct {
		name string
		dir  string
		edit func(string) error
		want string
	}{
		{"world-writable pin dir", k.Path, func(p string) error { return os.Chmod(p, 0o777) }, "others may write"},
		{"group-writable parent", filepath.Dir(k.Path), func(p string) error { return os.Chmod(p, 0o770) }, "others may write"},
		{"another owner", k.Path, func(p string) error { return os.Chown(p, 1000, 1000) }, "owned by uid 1000"},
	} {
		if err := c.edit(c.dir); err != nil {
			t.Fatal(err)
		}
		if err := k.Write([]byte(attach.ValuePresent)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
		os.Chmod(c.dir, 0o700)
		os.Chown(c.dir, 0, 0)
	}
	write(t, k, attach.ValuePresent)
	write(t, k, "")
}

func TestPinDirRefusesOutsideBPFFS(t *testing.T) {
	testenv.Root(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "precious")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := &attach.PinDir{Path: dir}
	wantRead(t, k, attach.ValuePresent)
	if err := k.Write(nil); err == nil || !strings.Contains(err.Error(), "not inside a bpf filesystem") {
		t.Fatalf("removing a non-bpffs dir: %v", err)
	}
	exists(t, file)

	fresh := &attach.PinDir{Path: filepath.Join(dir, "new", "pins")}
	if err := fresh.Write([]byte(attach.ValuePresent)); err == nil || !strings.Contains(err.Error(), "not on a bpf filesystem") {
		t.Fatalf("creating a pin dir outside bpffs: %v", err)
	}
	gone(t, filepath.Join(dir, "new"))

	// Nor the root of a bpffs: other tools pin there too.
	fs := testBPFFS(t)
	pinProg(t, ebpf.XDP, "theirs", filepath.Join(fs, "theirs"))
	if err := (&attach.PinDir{Path: fs}).Write(nil); err == nil || !strings.Contains(err.Error(), "root of a bpf filesystem") {
		t.Fatalf("emptying a bpffs root: %v", err)
	}
	exists(t, filepath.Join(fs, "theirs"))

	for _, p := range []string{"", "/", "relative", "/a/../b"} {
		if err := (&attach.PinDir{Path: p}).Write(nil); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
}
