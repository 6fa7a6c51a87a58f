// Package docs holds lanes' documentation; its tests keep the
// cross-references true. In the README and the docs every relative link
// names a file that exists and, for a markdown file, a heading it has:
// the docs cite runs in docs/results and each other's sections by anchor,
// so a renamed heading or a removed result directory would otherwise
// break them silently. And every file name a comment or a document gives
// is one the repository has (names_test.go): a renamed or removed file
// would otherwise leave its readers looking for it.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	heading = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fence   = regexp.MustCompile("(?s)```.*?```")
	scheme  = regexp.MustCompile(`^[a-z]+:`)
	notSlug = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// pending are documents another branch of the project writes, which the
// docs link to before it is merged (path relative to the repository).
// A link to one of them passes while it is absent; once it exists it is
// checked like any other, and its entry can go.
var pending = map[string]bool{}

// isPending says whether path (relative to this directory) is one of the
// pending documents.
func isPending(path string) bool {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false
	}
	for p := range pending {
		if pa, err := filepath.Abs(filepath.Join("..", p)); err == nil && pa == abs {
			return true
		}
	}
	return false
}

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces to hyphens; a repeated heading gets -1, -2, ...
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(strings.ReplaceAll(h, "`", "")))
	return strings.ReplaceAll(notSlug.ReplaceAllString(h, ""), " ", "-")
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, seen := map[string]bool{}, map[string]int{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		m := heading.FindStringSubmatch(line)
		if inCode || m == nil {
			continue
		}
		s := slug(m[1])
		if n, ok := seen[s]; ok {
			seen[s] = n + 1
			s += "-" + string(rune('0'+n+1))
		} else {
			seen[s] = 0
		}
		out[s] = true
	}
	return out
}

// TestLinks checks the README, the documents here and the READMEs of the
// result directories (not the generated report.md files, whose plots are
// left out of the repository where they add nothing to the text).
func TestLinks(t *testing.T) {
	files := []string{"../README.md"}
	for _, pat := range []string{"*.md", "decisions/*.md", "results/*/README.md", "results/*/*/README.md", "../CONTRIBUTING.md"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	cache := map[string]map[string]bool{}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
			target := m[1]
			if scheme.MatchString(target) {
				continue // http(s), mailto: not checked offline
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			checked++
			if _, err := os.Stat(dest); err != nil {
				if isPending(dest) {
					t.Logf("%s: link %s: %s is pending (written on another branch)", f, target, dest)
					continue
				}
				t.Errorf("%s: link %s: no such file %s", f, target, dest)
				continue
			}
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if cache[dest] == nil {
				cache[dest] = anchors(t, dest)
			}
			if !cache[dest][anchor] {
				t.Errorf("%s: link %s: no heading with that anchor in %s", f, target, dest)
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d links checked: the test no longer finds the documents", checked)
	}
	t.Logf("%d links in %d files", checked, len(files))
}
