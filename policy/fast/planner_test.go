package fast_test

import (
	"testing"
	"time"

	"github.com/lanesnet/lanes/policy/fast"
)

// Settings out of range are refused in one line that says what to give.
func TestParse(t *testing.T) {
	o, err := fast.Parse(map[string]string{"x-interval": "200ms", "x-idle": "30s"})
	if err != nil || o.Interval != 200*time.Millisecond || o.Idle != 30*time.Second {
		t.Fatalf("Parse: %+v, %v", o, err)
	}
	for _, bad := range []map[string]string{{"x-interval": "1ms"}, {"x-interval": "2m"}, {"x-idle": "1500us"}, {"x-idle": "2h"}, {"x-idle": "soon"}} {
		if _, err := fast.Parse(bad); err == nil {
			t.Errorf("Parse(%v) took it", bad)
		}
	}
}
