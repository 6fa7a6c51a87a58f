// Package deploy_test checks the deployment files against the lanes they
// run: the systemd unit, the example configuration, the install script and
// the Kubernetes manifests.
package deploy_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/cmd/lanes/cli"
	"github.com/lanesnet/lanes/cmd/lanes/config"
	"github.com/spf13/pflag"
)

// unit reads a systemd unit: section -> key -> values, in file order.
func unit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string][]string{}
	sec := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			sec = strings.Trim(l, "[]")
			out[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || sec == "" {
				t.Fatalf("%s: line %q is no KEY=VALUE in a section", path, l)
			}
			out[sec][k] = append(out[sec][k], v)
		}
	}
	return out
}

const unitPath = "systemd/lanes.service"

// The unit runs lanes agent on the configuration file lanes looks for,
// bounded to the capabilities lanes needs, restarts it on failure but not
// for a bad file, and orders it after the network and the overlay daemons.
func TestSystemdUnit(t *testing.T) {
	u := unit(t, unitPath)
	one := func(sec, key, want string) {
		t.Helper()
		if got := u[sec][key]; len(got) != 1 || got[0] != want {
			t.Errorf("[%s] %s = %q, want %q", sec, key, got, want)
		}
	}
	one("Service", "Type", "simple")
	one("Service", "Restart", "on-failure")
	one("Service", "RestartPreventExitStatus", strconv.Itoa(config.ExitConfig))
	one("Unit", "Wants", "network-online.target")
	after := strings.Fields(strings.Join(u["Unit"]["After"], " "))
	for _, w := range []string{"network-online.target", "docker.service", "flanneld.service"} {
		if !slices.Contains(after, w) {
			t.Errorf("After= %v lacks %s", after, w)
		}
	}
	want := make([]string, len(lanesCaps))
	for i, c := range lanesCaps {
		want[i] = "CAP_" + c
	}
	if got := strings.Fields(strings.Join(u["Service"]["CapabilityBoundingSet"], " ")); !slices.Equal(got, want) {
		t.Errorf("CapabilityBoundingSet %v, want exactly %v (TestCapabilities)", got, want)
	}
	if u["Service"]["AmbientCapabilities"] != nil || u["Service"]["User"] != nil {
		t.Errorf("AmbientCapabilities %v, User %v: the agent runs as root, bounded", u["Service"]["AmbientCapabilities"], u["Service"]["User"])
	}
	if u["Service"]["ExecStopPost"] != nil {
		t.Errorf("ExecStopPost %v: a reset there would also run between a crash and the restart", u["Service"]["ExecStopPost"])
	}
	one("Install", "WantedBy", "multi-user.target")
}

// What ExecStart runs is a command lanes has, with flags it takes, and the
// file it names is where the install script puts the example, which lanes
// accepts.
func TestSystemdExecStart(t *testing.T) {
	u := unit(t, unitPath)
	exec := u["Service"]["ExecStart"]
	if len(exec) != 1 {
		t.Fatalf("ExecStart %q: want one", exec)
	}
	args := strings.Fields(exec[0])
	if args[0] != "/usr/local/bin/lanes" {
		t.Errorf("ExecStart runs %s, want /usr/local/bin/lanes (where scripts/install.sh puts it)", args[0])
	}
	root := cli.NewRoot()
	cmd, rest, err := root.Find(args[1:])
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Name() != "agent" {
		t.Fatalf("ExecStart runs lanes %s, want lanes agent", cmd.Name())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("lanes agent refuses the unit's flags %v: %v", rest, err)
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		t.Fatalf("lanes agent refuses the unit's arguments: %v", err)
	}
	path, _ := cmd.Flags().GetString("config")
	if path != config.DefaultPath {
		t.Errorf("the unit's --config is %q, want %s", path, config.DefaultPath)
	}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name != "config" {
			t.Errorf("the unit gives --%s beside --config: lanes agent refuses that", f.Name)
		}
	})
	c, err := config.Load("lanes.yaml")
	if err != nil {
		t.Fatalf("the example configuration is refused:\n%v", err)
	}
	if c.Agent.OnExit != config.OnExitReset || c.StateDir != "/run/lanes" || c.Agent.MetricsAddr != config.DefaultMetricsAddr {
		t.Errorf("the example: %+v", *c)
	}
	b, err := os.ReadFile("../scripts/install.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `conf="$DESTDIR`+config.DefaultPath+`"`) {
		t.Errorf("install.sh does not install %s", config.DefaultPath)
	}
}

// systemd itself finds nothing to complain of in the unit, where
// systemd-analyze is there. It checks that the binary exists: lanes is not
// installed here, so the check runs on a copy that names an executable
// that is.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "lanes.service")
	if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("/usr/local/bin/lanes"), []byte(self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", p).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// install.sh puts the binary, the unit and the example in place, and
// keeps a configuration that is there already.
func TestInstallScript(t *testing.T) {
	dest := t.TempDir()
	bin := filepath.Join(t.TempDir(), "lanes")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func() string {
		t.Helper()
		cmd := exec.Command("sh", "scripts/install.sh")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "DESTDIR="+dest, "BIN="+bin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	run()
	for _, f := range []string{"usr/local/bin/lanes", "etc/systemd/system/lanes.service", "etc/lanes/lanes.yaml"} {
		if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	conf := filepath.Join(dest, "etc/lanes/lanes.yaml")
	if err := os.WriteFile(conf, []byte("mode: falcon\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run(); !strings.Contains(out, "kept") {
		t.Errorf("second run: %s", out)
	}
	if b, _ := os.ReadFile(conf); string(b) != "mode: falcon\n" {
		t.Errorf("install.sh overwrote the configuration: %q", b)
	}
	got, _ := os.ReadFile(filepath.Join(dest, "etc/systemd/system/lanes.service"))
	want, _ := os.ReadFile(unitPath)
	if !bytes.Equal(got, want) {
		t.Error("the installed unit differs from deploy/systemd/lanes.service (PREFIX is /usr/local)")
	}
}
