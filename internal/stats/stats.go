// Package stats holds the small statistics more than one layer uses
// (the balancer's imbalance figure, the bench's spread of latencies and
// per-core load), so that neither imports the other for them.
package stats

import "math"

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
