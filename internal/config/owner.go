package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// unsafeError is a configuration file that someone other than root or
// lanes' own user could have written: lanes runs as root and does what
// the file says, so such a file hands root's power over the host's
// receive path (and its real-time scheduling) to that someone.
type unsafeError struct{ msg string }

func (e unsafeError) Error() string { return "config " + e.msg }
func (e unsafeError) ExitCode() int { return ExitConfig }

// readSafe reads the file at path after checking, on the open file, that
// root or lanes' user owns it and that neither group nor others may write
// it, and that no directory it is reached through (the one its path names
// and the one it resolves to, through a ConfigMap's symlinks) lets anyone
// else replace it. A read-only mount passes: nobody writes there.
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
	if err := checkWriters(path, "", &st, readOnlyFd(f)); err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, readError{err}
	}
	for _, d := range dirsOf(path, real) {
		var dst unix.Stat_t
		if err := unix.Stat(d, &dst); err != nil {
			return nil, readError{err}
		}
		if err := checkWriters(path, d, &dst, readOnlyPath(d)); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, readError{err}
	}
	return b, nil
}

// dirsOf is the directory of path and that of the file it resolves to.
func dirsOf(path, real string) []string {
	a, b := filepath.Dir(filepath.Clean(path)), filepath.Dir(real)
	if abs, err := filepath.Abs(a); err == nil && abs == b {
		return []string{a}
	}
	return []string{a, b}
}

// checkWriters refuses st (of path itself when dir is "", else of the
// directory dir that holds it) when its owner is neither root nor lanes'
// user, or group or others may write it; a directory with the sticky bit
// lets nobody replace a file that is not theirs, so its mode passes.
func checkWriters(path, dir string, st *unix.Stat_t, readOnly bool) error {
	what, fix := path, path
	if dir != "" {
		what, fix = fmt.Sprintf("%s: its directory %s", path, dir), dir
	}
	if uid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != uid {
		return unsafeError{fmt.Sprintf("%s is owned by uid %d, not by root or lanes' user (uid %d), who could rewrite what lanes applies as root: chown root %s", what, st.Uid, uid, fix)}
	}
	sticky := dir != "" && st.Mode&unix.S_ISVTX != 0
	if st.Mode&0o022 != 0 && !sticky && !readOnly {
		return unsafeError{fmt.Sprintf("%s has mode %#o: group or others may write it and so choose what lanes applies as root: chmod go-w %s", what, st.Mode&0o7777, fix)}
	}
	return nil
}

func readOnlyFd(f *os.File) bool {
	var s unix.Statfs_t
	return unix.Fstatfs(int(f.Fd()), &s) == nil && s.Flags&unix.ST_RDONLY != 0
}

func readOnlyPath(p string) bool {
	var s unix.Statfs_t
	return unix.Statfs(p, &s) == nil && s.Flags&unix.ST_RDONLY != 0
}
