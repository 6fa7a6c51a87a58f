package nsx

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
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

// A namespace whose file is not there is ErrNoNetNS, for both kinds of
// entry, and the function never runs; DoHandle runs in the handle's
// namespace.
func TestMissingNamespace(t *testing.T) {
	requireRoot(t)
	ran := false
	for _, do := range []func(string, func() error) error{Do, DoSysfs} {
		err := do("lanes-nsx-no-such-namespace", func() error { ran = true; return nil })
		if !errors.Is(err, ErrNoNetNS) {
			t.Errorf("entering a missing namespace: %v, want ErrNoNetNS", err)
		}
	}
	if ran {
		t.Error("the function ran")
	}
	name := "lanes-nsx-handle"
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var inside netns.NsHandle
	if err := DoHandle(h, func() (err error) { inside, err = netns.Get(); return err }); err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if !inside.Equal(h) {
		t.Errorf("DoHandle ran in %s, want %s", inside, h)
	}
}
