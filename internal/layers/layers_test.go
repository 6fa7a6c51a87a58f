// Package layers holds a test of the repository's layering: a package
// imports packages of its own layer or below, never above.
package layers

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/lanesnet/lanes/"

// layers, bottom up: each entry is a package path prefix (a whole path
// element), the longest matching prefix deciding a package's layer.
//   - internal: leaves (namespaces, cpusets, kernel facts), no lanes
//     package above them;
//   - topology, testbed and datapath: what the host has and lanes'
//     mechanism (BPF programs, knobs), no policy;
//   - control/plan: the plan contract policies and the engine share;
//   - control: the engine (journal, apply, reset, agent);
//   - policy: the planners and agents;
//   - bench: the benchmark, over the engine and the testbed;
//   - cmd, scripts, docs: the top.
var layers = [][]string{
	{"internal"},
	{"topology", "testbed", "datapath"},
	{"control/plan"},
	{"control"},
	{"policy"},
	{"bench"},
	{"cmd", "scripts", "docs", "deploy"},
}

// above are packages allowed to import above their layer, each with where
// it belongs; the test fails once one no longer does, so the list only
// shrinks. None now.
var above = map[string]string{}

func layerOf(pkg string) int {
	best, layer := -1, -1
	for i, prefixes := range layers {
		for _, p := range prefixes {
			if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > best {
				best, layer = len(p), i
			}
		}
	}
	return layer
}

// TestLayers reads the imports of every Go file but tests (a kernel test
// drives a policy through the engine, the layers below it) and fails on
// an import from a higher layer.
func TestLayers(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	imports := map[string]map[string]bool{} // package -> lanes packages it imports
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "out", "bin", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		for _, im := range f.Imports {
			p, err := strconv.Unquote(im.Path.Value)
			if err != nil {
				return err
			}
			if dep, ok := strings.CutPrefix(p, module); ok && dep != pkg {
				if imports[pkg] == nil {
					imports[pkg] = map[string]bool{}
				}
				imports[pkg][dep] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(imports) < 20 {
		t.Fatalf("read the imports of %d packages under %s: want the whole repository", len(imports), root)
	}
	var still []string
	for pkg, deps := range imports {
		lp := layerOf(pkg)
		if lp < 0 {
			t.Errorf("package %s has no layer: add its path to layers", pkg)
			continue
		}
		var up []string
		for dep := range deps {
			if ld := layerOf(dep); ld > lp {
				up = append(up, dep)
			}
		}
		slices.Sort(up)
		switch why, known := above[pkg]; {
		case len(up) > 0 && !known:
			t.Errorf("%s (layer %v) imports from above it: %v", pkg, layers[lp], up)
		case len(up) > 0:
			still = append(still, pkg+" ("+why+")")
		case known:
			t.Errorf("%s no longer imports from above its layer: take it off the list above", pkg)
		}
	}
	slices.Sort(still)
	t.Logf("importing from above, to move: %v", still)
}
