package attach

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultBPFFS is where bpffs is conventionally mounted.
const DefaultBPFFS = "/sys/fs/bpf"

// BPFFS is a bpf filesystem mounted at Path (DefaultBPFFS when empty). Its
// value is ValueMounted when Path is on a bpffs, "" otherwise, so a host
// without bpffs gets one for lanes and loses it again on reset, while a
// host that had one keeps it.
//
// The mount is made in the mount namespace of the calling process; it is
// not tied to a network namespace.
type BPFFS struct {
	Path string `json:"path,omitempty"`
}

func (k *BPFFS) path() string {
	if k.Path == "" {
		return DefaultBPFFS
	}
	return k.Path
}

func (k *BPFFS) Kind() string   { return KindBPFFS }
func (k *BPFFS) Key() string    { return KindBPFFS + ":" + k.path() }
func (k *BPFFS) String() string { return "bpffs at " + k.path() }

func (k *BPFFS) Read() ([]byte, error) {
	p := k.path()
	if err := checkPath(p); err != nil {
		return nil, err
	}
	on, err := onBPFFS(p)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", k, err)
	}
	if on {
		return []byte(ValueMounted), nil
	}
	return nil, nil
}

func (k *BPFFS) Write(v []byte) error {
	p := k.path()
	if err := checkPath(p); err != nil {
		return err
	}
	on, err := onBPFFS(p)
	if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	switch string(v) {
	case ValueMounted:
		if on {
			return nil // stacking a second bpffs would hide the pins in the first
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("mounting %s: %w", k, err)
		}
		// mode=0700 as systemd mounts it: pins hold lanes' maps, which
		// steer traffic and are nobody else's business.
		if err := unix.Mount("bpf", p, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mounting %s: %w", k, err)
		}
		return nil
	case "":
		if !on {
			return nil
		}
		root, err := isMountRoot(p)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if !root {
			return fmt.Errorf("%s: %s is inside a bpffs mounted above it, which lanes did not mount: not unmounting", k, p)
		}
		// Another lanes target (or anyone) may still have pins in it: the
		// mount is shared, its journal entry is per target. Leave it
		// mounted then; the reset that finds it empty unmounts it.
		if busy, err := bpffsInUse(p); err != nil || busy {
			return err
		}
		// Detach lazily: an open pin or a process with its cwd there must
		// not make reset fail; the filesystem goes when they let go.
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", k, err)
		}
		return nil
	}
	return fmt.Errorf("%s: bad value %q (want %q or \"\")", k, v, ValueMounted)
}

// PinDir is a directory in bpffs that lanes pins programs, maps and links
// into. Its value is ValuePresent when the directory exists, "" when not.
// Writing "" removes the directory with everything in it, which is what
// makes it the safety net of a reset: journaled before the first pin, it is
// restored after every other knob and takes along pins no other knob
// recorded (a crash between pinning and journaling).
type PinDir struct {
	Path string `json:"path"`
}

func (k *PinDir) Kind() string   { return KindPinDir }
func (k *PinDir) Key() string    { return KindPinDir + ":" + k.Path }
func (k *PinDir) String() string { return "bpf pin dir " + k.Path }

func (k *PinDir) Read() ([]byte, error) {
	if err := checkPath(k.Path); err != nil {
		return nil, err
	}
	fi, err := os.Lstat(k.Path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", k, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%s: exists and is not a directory", k)
	}
	return []byte(ValuePresent), nil
}

func (k *PinDir) Write(v []byte) error {
	if err := checkPath(k.Path); err != nil {
		return err
	}
	switch string(v) {
	case ValuePresent:
		return k.create()
	case "":
		return k.remove()
	}
	return fmt.Errorf("%s: bad value %q (want %q or \"\")", k, v, ValuePresent)
}

func (k *PinDir) create() error {
	// Check before creating anything: on another filesystem MkdirAll would
	// succeed and leave a directory that pinning into then fails on.
	existing := k.Path
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		existing = filepath.Dir(existing)
	}
	on, err := onBPFFS(existing)
	if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	if !on {
		return fmt.Errorf("%s: %s is not on a bpf filesystem (mount one first)", k, existing)
	}
	if err := os.MkdirAll(k.Path, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", k, err)
	}
	return checkOwned(k.Path, filepath.Dir(k.Path))
}

// checkOwned refuses directories lanes would pin into (or hold pins
// under) that another user owns or may write: whoever can write there can
// swap lanes' pins (a map the datapath trusts) for their own. A directory
// lanes made passes (owner root or lanes' own user, not writable by group
// or others); one someone else made, or opened up, does not.
func checkOwned(dirs ...string) error {
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return fmt.Errorf("bpf pin dir %s: %w", d, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("bpf pin dir %s: not a directory (a link?): remove it", d)
		}
		if uid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != uid {
			return fmt.Errorf("bpf pin dir %s is owned by uid %d, not by lanes' user: someone else made it; remove it and apply again", d, st.Uid)
		}
		if st.Mode&0o022 != 0 {
			return fmt.Errorf("bpf pin dir %s has mode %#o: others may write in it; remove it (or chmod go-w) and apply again", d, st.Mode&0o7777)
		}
	}
	return nil
}

func (k *PinDir) remove() error {
	var st unix.Stat_t
	if err := unix.Lstat(k.Path, &st); errors.Is(err, unix.ENOENT) {
		k.Tidy()
		return nil
	} else if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s: exists and is not a directory: not removing it", k)
	}
	on, err := onBPFFS(k.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	if !on {
		return fmt.Errorf("%s: not inside a bpf filesystem: refusing to remove it", k)
	}
	// The root of a bpffs holds other tools' pins too, and cannot be
	// removed anyway.
	if root, err := isMountRoot(k.Path); err != nil {
		return fmt.Errorf("%s: %w", k, err)
	} else if root {
		return fmt.Errorf("%s: is the root of a bpf filesystem: refusing to empty it", k)
	}
	if err := removeTree(k.Path, st.Dev); err != nil {
		return fmt.Errorf("removing %s: %w", k, err)
	}
	k.removeParent()
	return nil
}

// Tidy is what a reset does for a pin dir already gone (its datapath's
// unpin removed it): its empty parent goes too (knobs.Tidier).
func (k *PinDir) Tidy() {
	if _, err := os.Lstat(k.Path); errors.Is(err, os.ErrNotExist) {
		k.removeParent()
	}
}

// removeParent removes the pin dir's parent ("lanes/", made for the
// per-target dirs) if it is empty: the last one out takes it (Remove fails,
// as intended, while others remain). Only inside a bpffs, never its root.
func (k *PinDir) removeParent() {
	parent := filepath.Dir(k.Path)
	if on, err := onBPFFS(parent); err != nil || !on {
		return
	}
	if root, err := isMountRoot(parent); err != nil || root {
		return
	}
	os.Remove(parent)
}

// removeTree removes dir and everything below it without leaving the
// filesystem dev: a mount inside the pin dir is someone else's. Unlinking a
// pin drops the file's reference; the object goes when nothing else (a
// link, an fd, another pin) holds it.
func removeTree(dir string, dev uint64) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if e.IsDir() {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); errors.Is(err, unix.ENOENT) {
				continue
			} else if err != nil {
				return &os.PathError{Op: "lstat", Path: p, Err: err}
			}
			if st.Dev != dev {
				return fmt.Errorf("%s is another mount: not removing it", p)
			}
			if err := removeTree(p, dev); err != nil {
				return err
			}
			continue
		}
		detachIfLink(p)
		if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: p, Err: err}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// detachIfLink detaches the link pinned at p, if p is a link pin. Unlinking
// alone would release the link too, but from a kernel work item some time
// later; detaching first means a device is clean when reset returns.
func detachIfLink(p string) {
	l, err := link.LoadPinnedLink(p, nil)
	if err != nil {
		return // not a link: a program or a map, or not a pin at all
	}
	defer l.Close()
	_ = l.Detach()
}

// onBPFFS reports whether path exists on a bpf filesystem.
func onBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Type == unix.BPF_FS_MAGIC, nil
}

// isMountRoot reports whether path is where a filesystem is mounted. statx
// says so directly, bind mounts included, where comparing devices with the
// parent would not.
func isMountRoot(path string) (bool, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, 0, &stx); err != nil {
		return false, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, fmt.Errorf("statx of %s: kernel does not report mount roots (needs Linux 5.8)", path)
	}
	return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// checkPath guards the knobs that mount and delete: a relative or unclean
// path would resolve differently in a later process.
func checkPath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("path %q must be a clean absolute path other than /", p)
	}
	return nil
}

// bpffsInUse says whether a bpffs mount holds anything but empty
// directories (lanes' own "lanes/" parent) and the kernel's preloaded
// iterators.
func bpffsInUse(root string) (bool, error) {
	busy := false
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// The kernel preloads these iterators into every fresh bpffs.
		if filepath.Dir(path) == filepath.Clean(root) && (d.Name() == "progs.debug" || d.Name() == "maps.debug") {
			return nil
		}
		if !d.IsDir() {
			busy = true
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("looking into %s: %w", root, err)
	}
	return busy, nil
}
