package results

import "fmt"

// Bytes formats a message size for tables and plots: "64 B", "1400 B",
// "64 KiB".
func Bytes(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// OfferedLabel names a paced point's offered rate: "offered 600 Kpps", or
// "unpaced" for 0.
func OfferedLabel(pps int) string {
	if pps == 0 {
		return "unpaced"
	}
	if pps%1000 == 0 {
		return fmt.Sprintf("offered %d Kpps", pps/1000)
	}
	return fmt.Sprintf("offered %d pps", pps)
}
