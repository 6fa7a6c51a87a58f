package plan

import (
	"maps"
	"strings"
	"testing"
)

// CurrentKeys reads old keys as their current ones and leaves the rest;
// a setting under two of its keys is an error naming both.
func TestCurrentKeys(t *testing.T) {
	params := []Param{{Key: "rate"}, {Key: "x-park", OldKeys: []string{"park", "parking"}}}
	for _, tc := range []struct {
		in, want map[string]string
		err      string
	}{
		{in: nil, want: map[string]string{}},
		{in: map[string]string{"rate": "1", "x-park": "false"}, want: map[string]string{"rate": "1", "x-park": "false"}},
		{in: map[string]string{"rate": "1", "park": "false"}, want: map[string]string{"rate": "1", "x-park": "false"}},
		{in: map[string]string{"parking": "true"}, want: map[string]string{"x-park": "true"}},
		{in: map[string]string{"park": "false", "x-park": "false"}, err: "settings park and x-park both given: both name the setting x-park; give it once, as x-park"},
		{in: map[string]string{"park": "false", "parking": "true"}, err: "settings parking and park both given"},
	} {
		got, err := CurrentKeys(params, tc.in)
		switch {
		case tc.err != "":
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error starting %q", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.in, err)
		case !maps.Equal(got, tc.want):
			t.Errorf("%v: %v, want %v", tc.in, got, tc.want)
		}
	}
	in := map[string]string{"park": "false"}
	if _, err := CurrentKeys(params, in); err != nil || len(in) != 1 || in["park"] != "false" {
		t.Errorf("CurrentKeys changed its argument: %v (%v)", in, err)
	}
}

// Comparison settings are the ones under ComparisonPrefix.
func TestParamComparison(t *testing.T) {
	if !(Param{Key: "x-park"}).Comparison() || (Param{Key: "park"}).Comparison() {
		t.Error("Comparison: want x-park alone")
	}
}
