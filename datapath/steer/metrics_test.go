//go:build linux

package steer

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The collector reads a pinned datapath at scrape time: per-stage packet
// counters always, the high class's quiet state only with a quiet time;
// a datapath that is gone yields nothing and no error.
func TestCollector(t *testing.T) {
	d := prioDatapath(t, true, time.Hour)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	runXDP(t, d, vxlanFrame(frameSpec{flow: udpFlow(40000)}))
	gather := func() map[string]float64 {
		t.Helper()
		r := prometheus.NewRegistry()
		r.MustRegister(NewCollector(dir))
		mfs, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				key := mf.GetName()
				for _, l := range m.GetLabel() {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				if c := m.GetCounter(); c != nil {
					out[key] = c.GetValue()
				} else {
					out[key] = m.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	got := gather()
	if v, ok := got["lanes_steer_packets_total,outcome=steered,stage=split"]; !ok || v != 1 {
		t.Errorf("split steered = %v (%v), want 1: %v", v, ok, got)
	}
	if _, ok := got["lanes_prism_high_quiet"]; ok {
		t.Error("quiet state exported without a quiet time")
	}
	queued := 0
	for k := range got {
		if strings.HasPrefix(k, "lanes_steer_queue_frames_total,core=") && strings.HasSuffix(k, ",event=enqueued") {
			queued++
		}
	}
	if queued != 1 {
		t.Errorf("%d bulk queues exported after one steered frame, want 1: %v", queued, got)
	}
	cfg, _ := d.Config()
	cfg.PrioIdleInline, cfg.PrioQuiet, cfg.HighAutoPPS, cfg.BulkQuiet = true, time.Second, 5000, 20*time.Millisecond
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	got = gather()
	if got["lanes_prism_high_quiet"] != 1 {
		t.Errorf("no high-priority frame yet: quiet %v, want 1", got["lanes_prism_high_quiet"])
	}
	if got["lanes_prism_bulk_quiet"] != 1 {
		t.Errorf("no bulk frame yet: bulk quiet %v, want 1", got["lanes_prism_bulk_quiet"])
	}
	if _, ok := got["lanes_prism_since_high_seconds"]; ok {
		t.Error("time since the last high-priority frame exported before the first")
	}
	if v, ok := got["lanes_prism_high_inline"]; !ok || v != 0 {
		t.Errorf("rules inline = %v (%v), want 0: every rule's flows in their queue", v, ok)
	}
	for _, s := range []string{"dst 10.1.1.1", "dst 10.1.1.2 port 80 tcp"} {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Prio().AddRule(r); err != nil {
			t.Fatal(err)
		}
		if err := d.Prio().SetHighInline(r, switchUntil(true)); err != nil {
			t.Fatal(err)
		}
	}
	if got := gather(); got["lanes_prism_high_inline"] != 2 {
		t.Errorf("rules inline = %v after two switches, want 2", got["lanes_prism_high_inline"])
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	if got := gather(); len(got) != 0 {
		t.Errorf("gone datapath: %v", got)
	}
}
