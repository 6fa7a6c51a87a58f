// Package mountinfo reads the mount table of lanes' mount namespace
// (/proc/self/mountinfo): which namespace files are bound where, and what
// is mounted under a directory.
package mountinfo

import (
	"os"
	"strconv"
	"strings"
)

// Mount is one line of mountinfo: "ID PARENT MAJ:MIN ROOT POINT OPTS
// [TAGS] - FSTYPE SOURCE SUPEROPTS".
type Mount struct {
	Root   string // the mounted object's root: "net:[INODE]" for a bound network namespace
	Point  string // where it is mounted
	FSType string
}

// Read returns lanes' mount table, in mount order.
func Read() ([]Mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return Parse(string(b)), nil
}

// Parse parses a mountinfo text, undoing its octal escapes (\040 for a
// space) in paths; malformed lines are skipped.
func Parse(info string) []Mount {
	var out []Mount
	for _, line := range strings.Split(info, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 {
			continue
		}
		out = append(out, Mount{Root: unescape(f[3]), Point: unescape(f[4]), FSType: g[0]})
	}
	return out
}

// NetNS lists the mount points of bound network namespace files: nsfs
// mounts whose root is "net:[INODE]".
func NetNS(ms []Mount) []string {
	var out []string
	for _, m := range ms {
		if m.FSType == "nsfs" && strings.HasPrefix(m.Root, "net:[") {
			out = append(out, m.Point)
		}
	}
	return out
}

// Under lists the mount points at or below dir.
func Under(ms []Mount, dir string) []string {
	var out []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	return out
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
