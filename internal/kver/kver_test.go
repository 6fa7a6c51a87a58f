package kver

import "testing"

func TestAtLeast(t *testing.T) {
	for _, c := range []struct {
		rel          string
		major, minor int
		want, err    bool
	}{
		{"6.18.44-fc-v445", 6, 15, true, false},
		{"6.15.0-rc1", 6, 15, true, false},
		{"6.14.11", 6, 15, false, false},
		{"7.0.0", 6, 15, true, false},
		{"5.15.0", 6, 6, false, false},
		{"garbage", 6, 6, false, true},
	} {
		got, err := AtLeast(c.rel, c.major, c.minor)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("AtLeast(%q, %d, %d) = %v, %v", c.rel, c.major, c.minor, got, err)
		}
	}
	if r, err := Release(); err != nil || r == "" {
		t.Errorf("Release() = %q, %v", r, err)
	}
}
