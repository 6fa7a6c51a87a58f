package fast_test

import (
	"testing"
	"time"

	"github.com/lanesnet/lanes/policy/fast"
)

// Settings out of range are refused in one line that says what to give.
func TestParse(t *testing.T) {
	o, err := fast.Parse(map[string]string{"interval": "200ms", "idle": "30s"})
	if err != nil || o.Interval != 200*time.Millisecond || o.Idle != 30*time.Second {
		t.Fatalf("Parse: %+v, %v", o, err)
	}
	for _, bad := range []map[string]string{{"interval": "1ms"}, {"interval": "2m"}, {"idle": "1500us"}, {"idle": "2h"}, {"idle": "soon"}} {
		if _, err := fast.Parse(bad); err == nil {
			t.Errorf("Parse(%v) took it", bad)
		}
	}
}
