package workload

import (
	"math"
	"sort"
	"strconv"

	"github.com/lanesnet/lanes/bench/results"
)

// cdfFractions is the grid a latency CDF is thinned to: dense in the
// tail, where overlay modes differ, sparse in the body. 120 points.
var cdfFractions = func() []float64 {
	fs := []float64{0.001, 0.005}
	for i := 1; i <= 99; i++ {
		fs = append(fs, float64(i)/100)
	}
	for i := 1; i <= 9; i++ {
		fs = append(fs, 0.99+float64(i)/1000)
	}
	for i := 1; i <= 9; i++ {
		fs = append(fs, 0.999+float64(i)/10000)
	}
	fs = append(fs, 1)
	for i, f := range fs {
		fs[i] = math.Round(f*1e6) / 1e6 // 0.991, not 0.9910000000000001
	}
	return fs
}()

// pctLabel is fraction f as a percentile label: 0.999 -> "99.9".
func pctLabel(f float64) string {
	return strconv.FormatFloat(math.Round(f*1e6)/1e4, 'f', -1, 64)
}

// quantileSorted is the nearest-rank q-quantile of sorted values.
func quantileSorted(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(n))) - 1
	if i < 0 {
		i = 0
	}
	if i >= n {
		i = n - 1
	}
	return sorted[i]
}

// cdfFromSamples sorts samples in place and thins them to cdfFractions.
func cdfFromSamples(samples []float64) []results.CDFPoint {
	if len(samples) == 0 {
		return nil
	}
	sort.Float64s(samples)
	out := make([]results.CDFPoint, 0, len(cdfFractions))
	for _, f := range cdfFractions {
		out = append(out, results.CDFPoint{Us: quantileSorted(samples, f), Fraction: f})
	}
	return out
}
