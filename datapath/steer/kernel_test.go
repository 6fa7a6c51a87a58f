//go:build linux

package steer

import "testing"

func TestCPUMapGROSupport(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.0-1-cloud-amd64": true,
		"6.15.0-rc1":           true,
		"7.0.0":                true,
		"6.14.11":              false,
		"6.8.0-60-generic":     false,
		"5.15.0":               false,
		"garbage":              false,
	} {
		got, reason := cpumapGROSupport(release)
		if got != want || reason == "" {
			t.Errorf("%s: %v (%q), want %v", release, got, reason, want)
		}
	}
	ok, reason := KernelSupport()
	t.Logf("this kernel: %v: %s", ok, reason)
}
