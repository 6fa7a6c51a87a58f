package nsx

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

func TestDoSysfsSeesNamespaceDevices(t *testing.T) {
	requireRoot(t)
	name := "lanes-nsx-test"
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(name) })

	var ents []os.DirEntry
	err := DoSysfs(name, func() error {
		var err error
		ents, err = os.ReadDir("/sys/class/net")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "lo" {
		t.Fatalf("netns sysfs shows %v, want only lo", ents)
	}
	// The calling thread's view is unchanged.
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		t.Fatalf("root /sys lost: %v", err)
	}
}

func TestStartInheritsNamespace(t *testing.T) {
	requireRoot(t)
	name := "lanes-nsx-test2"
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Delete(name) })
	out, err := Output(name, "cat", "/proc/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(out), ":") != 1 {
		t.Fatalf("child sees devices of another namespace:\n%s", out)
	}
	_ = exec.Command
}
