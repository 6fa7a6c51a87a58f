package topology

import (
	"os"
	"path/filepath"
	"testing"
)

// The cached ebtables answer is read again only when the list of loaded
// modules changes: use counts and dependents change without a load.
func TestLoadedModules(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "modules")
	read := func(content string) string {
		t.Helper()
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := loadedModules(p)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := read("veth 45056 0 - Live 0x0\nbridge 380928 1 br_netfilter, Live 0x0\n")
	b := read("veth 45056 2 - Live 0x0\nbridge 380928 0 - Live 0x0\n")
	if a != b {
		t.Errorf("use counts changed the key: %q, %q", a, b)
	}
	c := read("veth 45056 0 - Live 0x0\nbridge 380928 1 - Live 0x0\nebtables 45056 0 - Live 0x0\n")
	if c == a {
		t.Errorf("a module loaded and the key stayed %q", c)
	}
	if e := read(""); e == a || e == "-" {
		t.Errorf("no module loaded gives %q, like another state", e)
	}
	if m, err := loadedModules(filepath.Join(dir, "absent")); err != nil || m != "-" {
		t.Errorf("no module support: %q, %v; want \"-\"", m, err)
	}
}
