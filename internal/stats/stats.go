// Package stats holds the small statistics more than one layer uses
// (the balancer's imbalance figure, the bench's spread of latencies and
// per-core load), so that neither imports the other for them.
package stats

import (
	"math"
	"slices"
)

// StdDev is the population standard deviation of xs; 0 for none. Over
// per-core utilization it is the imbalance figure the MFLOW paper reports
// (Falcon 20.5 vs MFLOW 11.6 over 10 cores).
func StdDev(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var mean float64
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss / float64(len(xs)))
}

// MedianInterval is a distribution-free confidence interval for the
// median of the population xs were drawn from: the k-th smallest and the
// k-th largest of xs, with k the largest whose coverage, 1 - 2 P(B < k)
// for B ~ Binomial(n, 1/2), is at least conf. Below the n where even
// min-max falls short of conf (n < 6 for 0.95), it is min-max and its
// coverage says how much it holds. ok is false for no xs.
func MedianInterval(xs []float64, conf float64) (lo, hi, coverage float64, ok bool) {
	n := len(xs)
	if n == 0 {
		return 0, 0, 0, false
	}
	s := append([]float64(nil), xs...)
	slices.Sort(s)
	// tail[j] = P(B <= j), built term by term: C(n, j) / 2^n.
	term := math.Pow(0.5, float64(n))
	cdf := 0.0
	k := 1
	coverage = 1 - 2*term
	for j := 0; j < n/2; j++ {
		cdf += term
		term = term * float64(n-j) / float64(j+1)
		// The interval [x_(j+2), x_(n-j-1)] leaves out j+1 on each side.
		c := 1 - 2*(cdf+term)
		if c < conf || j+2 > n-j-1 {
			break
		}
		k, coverage = j+2, c
	}
	return s[k-1], s[n-k], coverage, true
}
