package docs

import (
	"bytes"
	"errors"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The file names comments and documents give: a reader follows one to
// the code or the text it means, so each must name a file the repository
// has. TestFileNames reads the comments of the Go and C sources, of the
// shell scripts and the build and deployment files, and the whole of
// every markdown document, takes every word that looks like a file name
// of the kinds lanes writes (.go, .c, .h, .md, .sh), and looks for it in
// the repository's tree.

var (
	// word is a run of the characters a path is written with; a file
	// name is one that ends in one of the extensions below.
	word     = regexp.MustCompile(`[A-Za-z0-9_./+-]+`)
	fileName = regexp.MustCompile(`^([A-Za-z0-9_.+-]*/)*[A-Za-z_][A-Za-z0-9_.+-]*\.(go|c|h|md|sh)$`)
	// generated marks a Go file written by a tool (bpf2go): its comments
	// are the tool's, not the project's.
	generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)
)

// kernelPrefixes start the paths of the Linux sources the comments and
// documents cite (net/core/dev.c, drivers/net/veth.c, include/linux/...,
// and the UAPI headers as a program includes them, linux/if_link.h). A
// path under one of them that the repository does not have is the
// kernel's, not a stale name of lanes'.
var kernelPrefixes = []string{
	"net/", "drivers/", "include/", "kernel/", "tools/", "arch/", "Documentation/",
	"lib/", "mm/", "fs/", "linux/",
}

// outputs start the paths of what make and lanes bench write (bin/lanes,
// out/quick/report.md): the tree has none of them until a build or a run.
var outputs = []string{"bin/", "out/"}

// elsewhere are files of other projects the comments and documents cite,
// by the name they give them, each with whose it is. Keep it short: a
// name of lanes' never belongs here.
var elsewhere = map[string]string{
	"switches.h":      "sockperf's source (its busy-wait switch)",
	"src/message.h":   "sockperf's source (its message header)",
	"balancer_maps.h": "katran's source (its map value types)",
	"vmlinux.h":       "the header bpftool dumps from a kernel's BTF, which lanes does without",
}

// tree is every file under the repository root but the build outputs,
// as slash-separated paths from the root. The tree rather than git
// ls-files: make unit runs this test as nobody, for whom git refuses a
// repository another user owns.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrPermission) && d != nil && d.IsDir() {
			// Not the tree's: make unit runs this as nobody, and a
			// directory root's runs left behind may be closed to it.
			t.Logf("skipping %s: %v", p, err)
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.Name() == ".git":
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil // a worktree's .git file
		case d.IsDir() && (rel == "out" || rel == "bin"):
			return filepath.SkipDir
		case !d.IsDir():
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// goComments is the text of a Go file's comments.
func goComments(src []byte) string {
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", fset.Base(), len(src)), src, nil, scanner.ScanComments)
	var b strings.Builder
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			return b.String()
		}
		if tok == token.COMMENT {
			b.WriteString(lit)
			b.WriteByte('\n')
		}
	}
}

// cComments is the text of a C file's comments: /* */ and //, outside
// string and character literals.
func cComments(src []byte) string {
	var b strings.Builder
	for i := 0; i < len(src); i++ {
		switch {
		case bytes.HasPrefix(src[i:], []byte("/*")):
			end := bytes.Index(src[i+2:], []byte("*/"))
			if end < 0 {
				end = len(src) - i - 2
			}
			b.Write(src[i+2 : i+2+end])
			b.WriteByte('\n')
			i += 2 + end + 1
		case bytes.HasPrefix(src[i:], []byte("//")):
			end := bytes.IndexByte(src[i:], '\n')
			if end < 0 {
				end = len(src) - i
			}
			b.Write(src[i : i+end])
			b.WriteByte('\n')
			i += end
		case src[i] == '"' || src[i] == '\'':
			q := src[i]
			for i++; i < len(src) && src[i] != q && src[i] != '\n'; i++ {
				if src[i] == '\\' {
					i++
				}
			}
		}
	}
	return b.String()
}

// shellComments is the text of the whole-line # comments of a shell
// script, the Makefile, a Dockerfile, a YAML file or a systemd unit.
func shellComments(src []byte) string {
	var b strings.Builder
	for _, l := range strings.Split(string(src), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "#!") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// prose is the text of file f (a path from the root) a reader reads for
// file names, and whether it is one to read at all.
func prose(t *testing.T, root, f string) (string, bool) {
	t.Helper()
	base := path.Base(f)
	ext := path.Ext(f)
	switch {
	case ext == ".md":
		// The reports lanes bench writes into a run's directory name
		// what the run had, not the repository's files.
		if strings.HasPrefix(f, "docs/results/") && strings.HasPrefix(base, "report") {
			return "", false
		}
	case ext == ".go", ext == ".c", ext == ".h":
	case ext == ".sh", ext == ".yaml", ext == ".service", base == "Makefile", base == "Dockerfile":
	default:
		return "", false
	}
	src, err := os.ReadFile(filepath.Join(root, f))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case ext == ".md":
		return string(src), true
	case ext == ".go":
		if generated.Match(src) {
			return "", false
		}
		return goComments(src), true
	case ext == ".c", ext == ".h":
		return cComments(src), true
	default:
		return shellComments(src), true
	}
}

// names are the words of text that name files: not URLs
// (https://host/x.go), files of a commit (beca56f:docs/x.md), absolute
// paths on a host, Go import paths (github.com/x/y.go) or patterns
// (*_bpfel.go, <name>.go).
func names(text string) []string {
	var out []string
	for _, loc := range word.FindAllStringIndex(text, -1) {
		w := strings.TrimRight(text[loc[0]:loc[1]], ".-")
		if !fileName.MatchString(w) || strings.HasPrefix(w, "/") {
			continue
		}
		if first, _, ok := strings.Cut(w, "/"); ok && strings.Contains(first, ".") && first != "." && first != ".." {
			continue
		}
		if loc[0] > 0 && strings.ContainsRune("*<>{}$%@~:", rune(text[loc[0]-1])) {
			continue
		}
		if loc[1] < len(text) && strings.ContainsRune("*<>{}$%", rune(text[loc[1]])) {
			continue
		}
		out = append(out, w)
	}
	return out
}

// TestFileNames checks that every file name a comment or document gives
// is one the repository has: a bare name anywhere in it, a path from the
// root, from the naming file's directory, or as the end of a longer path
// (bpf/order.h for datapath/steer/bpf/order.h).
func TestFileNames(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root is not %s: %v", root, err)
	}
	files := tree(t, root)
	have := map[string]bool{}
	base := map[string]bool{}
	for _, f := range files {
		have[f] = true
		base[path.Base(f)] = true
	}
	exists := func(from, name string) bool {
		if !strings.Contains(name, "/") {
			return base[name]
		}
		if have[path.Clean(name)] || have[path.Join(path.Dir(from), name)] {
			return true
		}
		name = strings.TrimPrefix(path.Clean(name), "./")
		for _, f := range files {
			if strings.HasSuffix(f, "/"+name) {
				return true
			}
		}
		return false
	}
	read, checked := 0, 0
	for _, f := range files {
		text, ok := prose(t, root, f)
		if !ok {
			continue
		}
		read++
		for _, n := range names(text) {
			checked++
			if exists(f, n) {
				continue
			}
			if _, ok := elsewhere[n]; ok {
				continue
			}
			if hasPrefix(n, kernelPrefixes) || hasPrefix(n, outputs) {
				continue
			}
			// A run's README names the scripts it ran, which the
			// directory keeps or git history does (kernel-6.12).
			if strings.HasPrefix(f, "docs/results/") && !strings.Contains(n, "/") && path.Ext(n) == ".sh" {
				continue
			}
			t.Errorf("%s: names %s, which the repository does not have", f, n)
		}
	}
	// A floor: a test that stopped finding the sources would pass.
	if read < 300 || checked < 300 {
		t.Errorf("read %d files and %d file names: the test no longer finds the sources", read, checked)
	}
	t.Logf("%d file names in %d files", checked, read)
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// TestNamesInText: which words names takes for file names.
func TestNamesInText(t *testing.T) {
	text := "place.go mirrors it; datapath/steer/place.go and `bpf/order.h`, " +
		"see [fast](../fast.md#the-way-out) and ./scripts/deps.sh. Not " +
		"https://github.com/cilium/cilium/blob/main/bpf/bpf_lxc.c, " +
		"beca56f:docs/layouts.md, github.com/x/y.go, /usr/include/linux/bpf.h, " +
		"*_bpfel.go, <name>.go, x.Config, 198.18.0.h, e.g. or steer.c:75's line."
	want := []string{"place.go", "datapath/steer/place.go", "bpf/order.h", "../fast.md", "./scripts/deps.sh", "steer.c"}
	if got := names(text); !slices.Equal(got, want) {
		t.Errorf("names:\n got %q\nwant %q", got, want)
	}
}
