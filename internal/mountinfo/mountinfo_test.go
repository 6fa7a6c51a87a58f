package mountinfo

import (
	"slices"
	"testing"
)

const sample = `22 1 0:21 / /proc rw,nosuid - proc proc rw
610 27 0:4 net:[4026532290] /run/netns/lanes-h1 rw shared:261 - nsfs nsfs rw
611 27 0:4 net:[4026532391] /run/docker/netns/1-osghgyvn34 rw - nsfs nsfs rw
612 27 0:4 mnt:[4026532400] /run/docker/mntns rw - nsfs nsfs rw
613 27 0:4 net:[4026532392] /var/lib/my\040dir/ns rw - nsfs nsfs rw
614 27 0:50 / /var/lib/my\040dir/ns/x rw - overlay overlay rw
garbage
`

func TestNetNS(t *testing.T) {
	got := NetNS(Parse(sample))
	want := []string{"/run/netns/lanes-h1", "/run/docker/netns/1-osghgyvn34", "/var/lib/my dir/ns"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestUnder(t *testing.T) {
	got := Under(Parse(sample), "/var/lib/my dir")
	want := []string{"/var/lib/my dir/ns", "/var/lib/my dir/ns/x"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := Under(Parse(sample), "/var/lib/my"); len(got) != 0 {
		t.Errorf("a sibling's prefix matched: %q", got)
	}
}
