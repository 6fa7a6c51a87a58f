package plan

import (
	"strings"
	"testing"
)

// Namespaces that share a target would share a journal and a pin
// directory: a reset of one would restore the other's knobs. Pairs whose
// names differ only where a flat target writes an underscore (a slash,
// a colon, a dot, or an underscore itself) get two targets, and the forms
// lanes meets keep their flat targets.
func TestTargetInjective(t *testing.T) {
	for _, pair := range [][2]string{
		{"/run/netns/a_b", "run_netns_a_b"},
		{"/run/netns/a/b", "/run/netns/a_b"},
		{"pid:42", "pid_42"},
		{"/proc/42/ns/net", "proc_42_ns_net"},
		{"a.b", "a_b"},
		{"a:b", "a_b"},
		{"host", ""},
		{"/var/run/docker/netns/ingress_sbox", "var_run_docker_netns_ingress_sbox"},
		{"/tmp/x_y", "/tmp/x/y"},
	} {
		a, b := Target(pair[0]), Target(pair[1])
		if a == b || PinDir(pair[0]) == PinDir(pair[1]) {
			t.Errorf("%q and %q share target %q (pins %s, %s)", pair[0], pair[1], a, PinDir(pair[0]), PinDir(pair[1]))
		}
	}
	for ns, want := range map[string]string{
		"":         "host",
		"lanes-h1": "lanes-h1",
		"blue_1":   "blue_1",
		"cni-1f2e3d4c-0000-1111-2222-333344445555": "cni-1f2e3d4c-0000-1111-2222-333344445555",
		"/run/netns/a_b":                     "run_netns_a_b",
		"/var/run/netns/cni-x":               "var_run_netns_cni-x",
		"/var/run/docker/netns/1-abc":        "var_run_docker_netns_1-abc",
		"/var/run/docker/netns/ingress_sbox": "var_run_docker_netns_ingress_sbox",
		"/run/docker/netns/lb_abc":           "run_docker_netns_lb_abc",
		"/proc/42/ns/net":                    "proc_42_ns_net",
		"/tmp/x/1-user":                      "tmp_x_1-user",
		"pid:42":                             "pid_42",
		"pid:42@8193":                        "pid_42",
	} {
		if got := Target(ns); got != want {
			t.Errorf("Target(%q) = %q, want %q (its flat target)", ns, got, want)
		}
	}
}

// Distinct namespaces have distinct targets, and every target is one
// file name bpffs takes (no '/', no '.', not empty): checked over every
// string of up to four characters from the ones the flattening confuses,
// after each prefix of the forms lanes knows.
func TestTargetInjectiveExhaustive(t *testing.T) {
	prefixes := []string{"", "/", "pid:", "pid_", "host", "/run/netns/", "run_netns_", "/var/run/docker/netns/",
		"var_run_docker_netns_", "/proc/", "proc_", "/tmp/", "tmp_", "%", "%5F"}
	alphabet := []string{"a", "1", "_", "/", ":", ".", "%", "@"}
	seen := map[string]string{}
	var walk func(s string, n int)
	walk = func(s string, n int) {
		ns := s
		if strings.HasPrefix(ns, "pid:") {
			ns, _, _ = strings.Cut(ns, "@") // pid:N@C is pid:N
		}
		got := Target(s)
		if prev, ok := seen[got]; ok && prev != ns {
			t.Fatalf("%q and %q share target %q", prev, ns, got)
		}
		seen[got] = ns
		if got == "" || strings.ContainsAny(got, "/.") {
			t.Fatalf("Target(%q) = %q: not one bpffs file name", s, got)
		}
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			walk(s+c, n-1)
		}
	}
	for _, p := range prefixes {
		walk(p, 4)
	}
	if len(seen) < 50000 {
		t.Fatalf("premise: %d distinct namespaces tried", len(seen))
	}
}
