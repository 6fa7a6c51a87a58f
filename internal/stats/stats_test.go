package stats

import (
	"math"
	"testing"
)

func TestStdDev(t *testing.T) {
	cases := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{42}, 0},
		{[]float64{50, 50, 50}, 0},
		{[]float64{0, 100}, 50},
		{[]float64{2, 4, 4, 4, 5, 5, 7, 9}, 2},
		{[]float64{10, 20, 30, 40}, math.Sqrt(125)},
	}
	for _, tc := range cases {
		if got := StdDev(tc.in); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("StdDev(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
