package nsx

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/testenv"
)

// procSysChildEnv names the namespace the test binary, started again in a
// mount namespace whose /proc/sys is read-only, writes a sysctl of.
const procSysChildEnv = "LANES_NSX_PROCSYS_NS"

// In a container, whose runtime mounts /proc/sys read-only, DoProcSys
// still writes a namespace's sysctl, and the container's own /proc/sys
// stays read-only. The container is a mount namespace with /proc/sys
// bound read-only over itself, as runc does.
func TestDoProcSysReadOnly(t *testing.T) {
	testenv.Root(t)
	if ns := os.Getenv(procSysChildEnv); ns != "" {
		procSysChild(t, ns)
		return
	}
	name := testNS(t, "lanes-nsx-procsys")
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" -test.run '^TestDoProcSysReadOnly$' -test.v`,
		os.Args[0])
	cmd.Env = append(os.Environ(), procSysChildEnv+"="+name)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("in a mount namespace with /proc/sys read-only: %v\n%s", err, out)
	}
	var got []byte
	if err := Do(name, func() (err error) { got, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward"); return err }); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != "1" {
		t.Errorf("ip_forward in %s is %q after the write, want 1", name, got)
	}
}

func procSysChild(t *testing.T, ns string) {
	readOnly := func() bool {
		var st unix.Statfs_t
		if err := unix.Statfs("/proc/sys", &st); err != nil {
			t.Fatal(err)
		}
		return st.Flags&unix.ST_RDONLY != 0
	}
	if !readOnly() {
		t.Fatal("premise: /proc/sys is read-only here")
	}
	if err := DoProcSys(ns, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0) }); err != nil {
		t.Fatalf("writing a sysctl of %s: %v", ns, err)
	}
	if !readOnly() {
		t.Error("/proc/sys became writable outside lanes' private mount")
	}
}
