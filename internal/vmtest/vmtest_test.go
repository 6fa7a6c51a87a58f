package vmtest

import (
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	in := `#
# Automatically generated file; DO NOT EDIT.
CONFIG_NET_SCH_BPF=y
CONFIG_VETH=m
# CONFIG_NET_SCH_NETEM is not set
CONFIG_LOCALVERSION=""
CONFIG_BUILD_SALT="7.3.4+deb13-amd64"
CONFIG_HZ=250
`
	m, err := parseConfig(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"CONFIG_NET_SCH_BPF":   "y",
		"CONFIG_VETH":          "m",
		"CONFIG_NET_SCH_NETEM": "",
		"CONFIG_LOCALVERSION":  "",
		"CONFIG_BUILD_SALT":    "7.3.4+deb13-amd64",
		"CONFIG_HZ":            "250",
	} {
		if m[k] != want {
			t.Errorf("%s = %q, want %q", k, m[k], want)
		}
	}
}

// The running kernel's configuration is found where a Debian host or a
// harness guest keeps it; where none is, Config says so instead of
// reporting every option off.
func TestConfigOfRunningKernel(t *testing.T) {
	v, from, err := Config("CONFIG_BPF")
	if err != nil {
		t.Skipf("no kernel configuration here: %v", err)
	}
	if v != "y" {
		t.Errorf("CONFIG_BPF = %q in %s; every kernel lanes runs on has BPF", v, from)
	}
	// The harness's newest kernel is chosen for its BPF qdisc: its
	// configuration must reach the guest's tests.
	if k, ok := Guest(); ok && k == "newest" {
		if v, _, _ := Config("CONFIG_NET_SCH_BPF"); v != "y" {
			t.Errorf("CONFIG_NET_SCH_BPF = %q in %s on the harness's newest kernel", v, from)
		}
	}
}
