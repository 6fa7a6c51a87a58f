package control

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, s := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// irqbalance and tuned are found by their processes, and what they would
// fight lanes over is read from their configuration: irqbalance's banned
// cores, tuned's active profile and the profiles it includes (/etc/tuned
// over the shipped ones).
func TestCoexistence(t *testing.T) {
	proc, root := t.TempDir(), t.TempDir()
	if got := coexistence(proc, root); len(got) != 0 {
		t.Fatalf("no daemons: %+v", got)
	}
	writeTree(t, proc, map[string]string{"812/comm": "irqbalance\n", "900/comm": "tuned\n", "77/comm": "bash\n", "self/comm": "lanes\n"})
	writeTree(t, root, map[string]string{
		"etc/default/irqbalance":                       "# banned\nIRQBALANCE_BANNED_CPULIST=\"2-3\"\n",
		"etc/tuned/active_profile":                     "mine\n",
		"etc/tuned/mine/tuned.conf":                    "[main]\ninclude=network-latency\n[sysctl]\nnet.core.rps_default_mask=3\n[scheduler]\nisolated_cores=2-3\n",
		"usr/lib/tuned/network-latency/tuned.conf":     "[main]\ninclude=latency-performance\n[sysctl]\nnet.core.busy_read=50\n[sysfs]\n/sys/class/net/*/queues/rx-*/rps_cpus=1\n",
		"usr/lib/tuned/latency-performance/tuned.conf": "[cpu]\nforce_latency=1\n",
	})
	got := coexistence(proc, root)
	if len(got) != 2 || got[0].Name != "irqbalance" || got[0].PID != 812 || got[1].Name != "tuned" || got[1].PID != 900 {
		t.Fatalf("found %+v", got)
	}
	irq := strings.Join(got[0].Fights, "\n")
	if !strings.HasPrefix(irq, "IRQ affinity: it moves the underlay NIC's interrupts") || !strings.Contains(irq, "banned cores (2-3)") || got[0].Config[0] != "/etc/default/irqbalance" {
		t.Errorf("irqbalance: %+v", got[0])
	}
	tu := got[1]
	if want := []string{"/etc/tuned/mine/tuned.conf", "/usr/lib/tuned/network-latency/tuned.conf", "/usr/lib/tuned/latency-performance/tuned.conf"}; strings.Join(tu.Config, " ") != strings.Join(want, " ") {
		t.Errorf("tuned profiles read: %v, want %v", tu.Config, want)
	}
	all := strings.Join(tu.Fights, "\n")
	for _, want := range []string{
		"profile mine sets net.core.rps_default_mask=3",
		"profile mine moves threads and IRQs (isolated_cores=2-3)",
		"profile network-latency writes /sys/class/net/*/queues/rx-*/rps_cpus=1",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("tuned fights lack %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "busy_read") {
		t.Errorf("a setting lanes does not touch is listed:\n%s", all)
	}
}
