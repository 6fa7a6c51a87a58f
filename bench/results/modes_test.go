package results

import (
	"reflect"
	"testing"
)

func TestParseModeSpec(t *testing.T) {
	m, p, err := ParseModeSpec("falcon:load=busy:threshold=70")
	if err != nil || m != "falcon" || !reflect.DeepEqual(p, map[string]string{"load": "busy", "threshold": "70"}) {
		t.Errorf("got %q %v %v", m, p, err)
	}
	if m, p, err := ParseModeSpec("vanilla"); err != nil || m != "vanilla" || p != nil {
		t.Errorf("plain mode: %q %v %v", m, p, err)
	}
	for _, bad := range []string{"falcon:load", "falcon:=1"} {
		if _, _, err := ParseModeSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Batch variants group by the spec without the batch setting, sorted by
// batch; other modes and unusable batches are in no series.
func TestBatchSeries(t *testing.T) {
	var runs []Run
	for _, m := range []string{"mflow:batch=256", "vanilla", "mflow:batch=16", "mflow:cores=2:batch=64", "mflow:batch=x", "mflow:batch=0", "mflow", "mflow:cores=2:batch=8"} {
		runs = append(runs, Run{Mode: m, Workload: "udp_stress"})
	}
	bases, series := Aggregate(runs, nil).BatchSeries()
	if want := []string{"mflow", "mflow:cores=2"}; !reflect.DeepEqual(bases, want) {
		t.Fatalf("bases %v, want %v", bases, want)
	}
	want := map[string][]BatchVariant{
		"mflow":         {{"mflow:batch=16", "mflow", 16}, {"mflow:batch=256", "mflow", 256}},
		"mflow:cores=2": {{"mflow:cores=2:batch=8", "mflow:cores=2", 8}, {"mflow:cores=2:batch=64", "mflow:cores=2", 64}},
	}
	if !reflect.DeepEqual(series, want) {
		t.Errorf("series %v\nwant %v", series, want)
	}
}
