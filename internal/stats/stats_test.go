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

// TestMedianInterval checks the order statistics against binomial tables:
// 5 values give min-max at 93.75%; 25 values the 8th smallest and largest
// (P(B <= 7) = 0.0216 for n = 25, so 95.7%); 100 values the 40th and 61st
// (P(B <= 39) = 0.0176).
func TestMedianInterval(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // descending: the function sorts
		}
		return xs
	}
	cases := []struct {
		n              int
		lo, hi, covMin float64
		covMax         float64
	}{
		{1, 1, 1, 0, 0},
		{5, 1, 5, 0.9375, 0.9375},
		{6, 1, 6, 0.968, 0.969},
		{25, 8, 18, 0.956, 0.957},
		{100, 40, 61, 0.964, 0.965},
	}
	for _, tc := range cases {
		lo, hi, cov, ok := MedianInterval(seq(tc.n), 0.95)
		if !ok || lo != tc.lo || hi != tc.hi || cov < tc.covMin-1e-9 || cov > tc.covMax+1e-9 {
			t.Errorf("n=%d: [%v, %v] at %.4f (%v), want [%v, %v] at %.4f-%.4f", tc.n, lo, hi, cov, ok, tc.lo, tc.hi, tc.covMin, tc.covMax)
		}
	}
	if _, _, _, ok := MedianInterval(nil, 0.95); ok {
		t.Error("an interval of nothing")
	}
}
