package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// unsafeError is a configuration file that someone other than root or
// lanes' own user could have written: lanes runs as root and does what
// the file says, so such a file hands root's power over the host's
// receive path (and its real-time scheduling) to that someone.
type unsafeError struct{ msg string }

func (e unsafeError) Error() string { return "config " + e.msg }
func (e unsafeError) ExitCode() int { return ExitConfig }

// readSafe reads the file at path after checking that root or lanes'
// user owns it and every directory from the one it is in up to /, and
// the one its path names, and that neither group nor others may write
// any of them (a sticky directory excepted). The file checked is the one
// opened: its directories are those of the path the kernel reports for
// the open file, not a second resolution of path. The modes inside a
// Kubernetes ConfigMap, Secret or projected volume are exempt
// (kubeVolume): only the kubelet writes there.
func readSafe(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, readError{err}
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, readError{err}
	}
	real, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return nil, readError{err}
	}
	vol := kubeVolume(f, real)
	if err := checkWriters(path, "", &st, vol != ""); err != nil {
		return nil, err
	}
	for _, d := range dirsOf(path, real) {
		var dst unix.Stat_t
		if err := unix.Stat(d, &dst); err != nil {
			return nil, readError{err}
		}
		if err := checkWriters(path, d, &dst, within(vol, d)); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, readError{err}
	}
	return b, nil
}

// dirsOf is every directory from that of real up to /, and the directory
// path names, which holds the name (perhaps a symlink) that was opened.
func dirsOf(path, real string) []string {
	var dirs []string
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		dirs = append(dirs, d)
		if d == "/" {
			break
		}
	}
	named, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		named = filepath.Dir(path)
	}
	for _, d := range dirs {
		if d == named {
			return dirs
		}
	}
	return append(dirs, named)
}

// checkWriters refuses st (of path itself when dir is "", else of the
// directory dir on its way) when its owner is neither root nor lanes'
// user, or group or others may write it (unless kube: inside a
// Kubernetes volume); a directory with the sticky bit lets nobody
// replace a file that is not theirs, so its mode passes.
func checkWriters(path, dir string, st *unix.Stat_t, kube bool) error {
	what, fix := path, path
	if dir != "" {
		what, fix = fmt.Sprintf("%s: its directory %s", path, dir), dir
	}
	if uid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != uid {
		return unsafeError{fmt.Sprintf("%s is owned by uid %d, not by root or lanes' user (uid %d), who could rewrite what lanes applies as root: chown root %s", what, st.Uid, uid, fix)}
	}
	sticky := dir != "" && st.Mode&unix.S_ISVTX != 0
	if st.Mode&0o022 != 0 && !sticky && !kube {
		return unsafeError{fmt.Sprintf("%s has mode %#o: group or others may write it and so choose what lanes applies as root: chmod go-w %s", what, st.Mode&0o7777, fix)}
	}
	return nil
}

// tsDir is the name of the kubelet's directory of one version of a
// volume's files (its atomic writer: "..2006_01_02_15_04_05." and a
// number).
var tsDir = regexp.MustCompile(`^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d+$`)

// kubeVolume is the root of the Kubernetes ConfigMap, Secret or
// projected volume that the open file f (at real) belongs to, or "". It
// is one when the file lies in a version directory (tsDir) that the
// volume's ..data symlink names, on a read-only mount whose root is the
// volume's: the container sees the kubelet's files through a mount it
// cannot write, and what the kubelet writes on the node is the API
// server's object, which only those allowed to change it choose. A
// read-only mount alone is not: the file may be writable through its
// source (a bind mount of a world-writable file).
func kubeVolume(f *os.File, real string) string {
	var fs unix.Statfs_t
	if unix.Fstatfs(int(f.Fd()), &fs) != nil || fs.Flags&unix.ST_RDONLY == 0 {
		return ""
	}
	parts := strings.Split(real, "/")
	for i := len(parts) - 2; i > 0; i-- {
		if !tsDir.MatchString(parts[i]) {
			continue
		}
		vol := "/" + filepath.Join(parts[:i]...)
		if l, err := os.Readlink(filepath.Join(vol, "..data")); err != nil || l != parts[i] {
			return ""
		}
		if !mountRootOf(f, vol) {
			return ""
		}
		return vol
	}
	return ""
}

// mountRootOf tells whether dir is the root of the mount the open file f
// is on.
func mountRootOf(f *os.File, dir string) bool {
	var fx, dx unix.Statx_t
	if unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &fx) != nil ||
		unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &dx) != nil {
		return false
	}
	return fx.Mask&dx.Mask&unix.STATX_MNT_ID != 0 && fx.Mnt_id == dx.Mnt_id &&
		dx.Attributes_mask&dx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// within tells whether dir is vol or below it.
func within(vol, dir string) bool {
	return vol != "" && (dir == vol || strings.HasPrefix(dir, vol+"/"))
}
