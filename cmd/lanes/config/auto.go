package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/topology"
	"github.com/vishvananda/netlink"
)

// AutoNetNS finds the namespace netns: auto stands for: the one that holds
// a VXLAN device, looked for where overlays keep theirs: the namespace
// lanes runs in (Flannel, Calico), Docker's namespace files (a swarm
// overlay's VXLAN lives in one of its own, 1-<network id>), and the
// namespaces named under /run/netns. None, or more than one, is an error
// that lists what to write instead.
//
// The namespace lanes runs in comes first, and counts as holding one when
// discovery finds the host's overlay from it: on a Docker host that is
// the overlay network whose VXLAN device dockerd moved into a namespace
// of its own (topology.Discover follows it, passing over the swarm's
// ingress network), so the host's namespace names the target.
func AutoNetNS() (string, error) {
	if _, err := topology.Discover(""); err == nil {
		return "", nil
	}
	return pickOverlay(autoCandidates(), hasVXLAN)
}

// autoCandidates lists the namespaces AutoNetNS looks in, in its order:
// "" (lanes' own), Docker's namespace files, then the named ones. Docker's
// are named by the path topology uses, so that one namespace always maps
// to one state directory.
func autoCandidates() []string {
	out := []string{""}
	if ents, err := os.ReadDir(topology.DockerNetNSDir); err == nil {
		for _, e := range ents {
			out = append(out, filepath.Join(topology.DockerNetNSDir, e.Name()))
		}
	}
	if ents, err := os.ReadDir(nsx.Dir); err == nil {
		for _, e := range ents {
			out = append(out, e.Name())
		}
	}
	return out
}

// hasVXLAN says whether namespace ns holds a VXLAN device.
func hasVXLAN(ns string) (bool, error) {
	found := false
	err := netnsx.Do(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Type() == "vxlan" {
				found = true
			}
		}
		return nil
	})
	return found, err
}

// pickOverlay is AutoNetNS over given candidates; namespaces that cannot
// be entered (a container that just went) are passed over.
func pickOverlay(candidates []string, has func(string) (bool, error)) (string, error) {
	var found []string
	seen := map[string]bool{}
	for _, ns := range candidates {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		if ok, err := has(ns); err == nil && ok {
			found = append(found, ns)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no namespace holds a VXLAN device (looked in lanes' own, %s and %s): start the overlay first, or set netns to the namespace that will hold it", topology.DockerNetNSDir, nsx.Dir)
	}
	names := make([]string, len(found))
	for i, ns := range found {
		names[i] = ns
		if ns == "" {
			names[i] = NetNSHost
		}
	}
	return "", fmt.Errorf("%d namespaces hold a VXLAN device (%s): set netns to the one lanes should steer", len(found), strings.Join(names, ", "))
}
