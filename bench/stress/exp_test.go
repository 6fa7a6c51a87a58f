package stress

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestExpPace(t *testing.T) {
	if os.Getenv("EXP") == "" {
		t.Skip()
	}
	p := newPair(t)
	pinNAPI(t, p.rcv, "u1", 1)
	for _, burst := range []int{32, 1024} {
		for _, rate := range []float64{10000, 100000, 500000, 1000000} {
			g, err := NewGenerator(p.target, GenConfig{CPU: 0, Rate: rate, Burst: burst})
			if err != nil {
				t.Fatal(err)
			}
			st, err := g.Run(context.Background(), 2*time.Second)
			g.Close()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("burst %d rate %.0f: sent %.0f (%+.2f%%) held %d (%.1f M runs/s) stalls %d calls %d", burst, rate, st.PPS(), (st.PPS()/rate-1)*100, st.Held, float64(st.Held)/st.Elapsed.Seconds()/1e6, st.Stalls, st.Calls)
		}
	}
}
