package testbed

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Docker as a swarm runs it: one dockerd per host namespace (each with
// its own data-root, exec-root, socket, pid file, engine key and
// cgroup-parent, so two engines share nothing), a swarm across the two,
// an attachable overlay network, and containers that dockerd starts on
// it. dockerd keeps the network's VXLAN device and bridge in a namespace
// of its own, bound under its exec-root, and each container's namespace
// there too; it runs in the host's network namespace but lanes' mount
// namespace, so those files stay visible to lanes.
//
// This kernel has no IPVS, so swarm services' virtual IPs and the routing
// mesh do not work (dockerd logs the missing ip_vs sysctls); the
// attachable overlay, container to container, does, and that is the path
// lanes works on. No registry is reachable: the containers run a busybox
// image imported from Debian's busybox-static.

const (
	// dockerNetwork is the testbed's overlay network; its subnet stays in
	// the testbed's range (the swarm's default pool would be 10.0.0.0/8).
	dockerNetwork = "lanes"
	dockerImage   = "lanes-testbed/busybox:1"
	// BusyboxPath is Debian's busybox-static, the image's one binary.
	BusyboxPath = "/bin/busybox"
)

var (
	dockerSubnet   = netip.MustParsePrefix("198.19.64.0/24")
	swarmPool      = "198.19.0.0/18"   // the ingress network's and any other swarm network's
	dockerBridgeIP = "198.19.128.0/17" // docker0 and docker_gwbridge, per host
)

func dockerDaemon(prefix string, h int) daemon {
	d := hostRunDir(prefix, h)
	return daemon{name: fmt.Sprintf("dockerd h%d", h), pidFile: filepath.Join(d, "dockerd.pid"), log: filepath.Join(d, "dockerd.log")}
}

func dockerExecRoot(prefix string, h int) string {
	return filepath.Join(hostRunDir(prefix, h), "docker")
}
func dockerSocket(prefix string, h int) string {
	return filepath.Join(hostRunDir(prefix, h), "docker.sock")
}

// dockerConfig is host h's daemon.json.
func dockerConfig(prefix string, h int) ([]byte, error) {
	run, data := hostRunDir(prefix, h), hostDataDir(prefix, h)
	return json.MarshalIndent(map[string]any{
		"data-root":           filepath.Join(data, "docker"),
		"exec-root":           dockerExecRoot(prefix, h),
		"pidfile":             filepath.Join(run, "docker-own.pid"),
		"hosts":               []string{"unix://" + dockerSocket(prefix, h)},
		"exec-opts":           []string{"native.cgroupdriver=cgroupfs"},
		"cgroup-parent":       "/" + cgroupParent(prefix, h),
		"deprecated-key-path": filepath.Join(run, "key.json"),
		"default-address-pools": []map[string]any{
			{"base": dockerBridgeIP, "size": 24},
		},
		// Containers run busybox sleep as PID 1, which ignores SIGTERM.
		"shutdown-timeout": 1,
	}, "", " ")
}

// docker is a client of one dockerd's API on its unix socket.
type docker struct {
	c    *http.Client
	host string // for messages
}

func newDocker(prefix string, h int) *docker {
	sock := dockerSocket(prefix, h)
	return &docker{host: fmt.Sprintf("h%d", h), c: &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}}
}

// call sends a request with a JSON body (or the reader in body, when it
// is one) and decodes a JSON answer into out (when not nil).
func (d *docker) call(method, path string, body any, out any) error {
	b, err := d.do(method, path, body)
	if err != nil {
		return err
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("dockerd %s: %s %s: %w", d.host, method, path, err)
		}
	}
	return nil
}

// DockerCall sends one request to dockerd on host h of the testbed under
// prefix (an overlay built by dockerd), with a JSON body or a tar stream
// (an io.Reader), and returns the answer's body: for tests that drive the
// daemon beyond what the testbed does, such as building and running lanes'
// own image.
func DockerCall(prefix string, h int, method, path string, body any) ([]byte, error) {
	return newDocker(prefix, h).do(method, path, body)
}

// DockerNetNSDir is where dockerd on host h binds its namespaces' files
// (Docker's /var/run/docker/netns).
func DockerNetNSDir(prefix string, h int) string {
	return filepath.Join(dockerExecRoot(prefix, h), "netns")
}

// do sends a request and returns the answer's body, or the daemon's error.
func (d *docker) do(method, path string, body any) ([]byte, error) {
	var r io.Reader
	ctype := "application/json"
	switch b := body.(type) {
	case nil:
	case io.Reader:
		r, ctype = b, "application/x-tar"
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, "http://docker/v1.41"+path, r)
	if err != nil {
		return nil, err
	}
	if r != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := d.c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("dockerd %s: %s %s: %w", d.host, method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		var e struct{ Message string }
		json.Unmarshal(b, &e)
		if e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		return nil, &dockerError{status: resp.StatusCode, msg: fmt.Sprintf("dockerd %s: %s %s: %s", d.host, method, path, e.Message)}
	}
	return b, nil
}

type dockerError struct {
	status int
	msg    string
}

func (e *dockerError) Error() string { return e.msg }

func isNotFound(err error) bool {
	var de *dockerError
	return errors.As(err, &de) && de.status == http.StatusNotFound
}

// dockerTools finds dockerd and checks for the image's busybox.
func dockerTools() (string, error) {
	dockerd, err := binary("LANES_DOCKERD", []string{"/usr/sbin/dockerd", "/usr/bin/dockerd"}, "dockerd", "install Debian's docker.io (make deps)")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(BusyboxPath); err != nil {
		return "", fmt.Errorf("%s not found: install Debian's busybox-static (make deps)", BusyboxPath)
	}
	return dockerd, nil
}

func (tb *Testbed) buildDocker() error {
	dockerd, err := dockerTools()
	if err != nil {
		return err
	}
	prefix := tb.Config.Prefix
	for i, h := range tb.Hosts {
		cfg, err := dockerConfig(prefix, i+1)
		if err != nil {
			return err
		}
		path := filepath.Join(hostRunDir(prefix, i+1), "daemon.json")
		if err := os.WriteFile(path, cfg, 0o600); err != nil {
			return err
		}
		if err := dockerDaemon(prefix, i+1).start(h.NetNS, []string{dockerd, "--config-file", path}, nil); err != nil {
			return err
		}
	}
	img, err := busyboxImage()
	if err != nil {
		return err
	}
	var clients [2]*docker
	for i := range tb.Hosts {
		clients[i] = newDocker(prefix, i+1)
		c := clients[i]
		if err := waitFor(60*time.Second, "dockerd "+c.host+" answering", func() (bool, error) {
			err := c.call("GET", "/_ping", nil, nil)
			return err == nil, err
		}); err != nil {
			return fmt.Errorf("%w (dockerd log: %s)", err, dockerDaemon(prefix, i+1).logTail())
		}
		q := url.Values{"fromSrc": {"-"}, "repo": {strings.Split(dockerImage, ":")[0]}, "tag": {strings.Split(dockerImage, ":")[1]}}
		if err := c.call("POST", "/images/create?"+q.Encode(), bytes.NewReader(img), nil); err != nil {
			return fmt.Errorf("importing the busybox image: %w", err)
		}
	}
	a, b := tb.Hosts[0].UnderlayAddr.Addr().String(), tb.Hosts[1].UnderlayAddr.Addr().String()
	if err := clients[0].call("POST", "/swarm/init", map[string]any{
		"ListenAddr": a + ":2377", "AdvertiseAddr": a,
		"DefaultAddrPool": []string{swarmPool}, "SubnetSize": 24,
	}, nil); err != nil {
		return err
	}
	var sw struct{ JoinTokens struct{ Worker string } }
	if err := clients[0].call("GET", "/swarm", nil, &sw); err != nil {
		return err
	}
	if err := clients[1].call("POST", "/swarm/join", map[string]any{
		"ListenAddr": b + ":2377", "AdvertiseAddr": b,
		"RemoteAddrs": []string{a + ":2377"}, "JoinToken": sw.JoinTokens.Worker,
	}, nil); err != nil {
		return err
	}
	var created struct {
		ID string `json:"Id"`
	}
	if err := clients[0].call("POST", "/networks/create", map[string]any{
		"Name": dockerNetwork, "Driver": "overlay", "Attachable": true, "CheckDuplicate": true,
		"IPAM": map[string]any{"Config": []map[string]string{{"Subnet": dockerSubnet.String()}}},
	}, &created); err != nil {
		return err
	}
	if err := os.WriteFile(networkIDFile(prefix), []byte(created.ID), 0o600); err != nil {
		return err
	}
	for i := range tb.Hosts {
		for k := 1; k <= tb.Config.Containers; k++ {
			ct, err := tb.dockerRun(i+1, k)
			if err != nil {
				return err
			}
			tb.Hosts[i].Containers = append(tb.Hosts[i].Containers, ct)
		}
		if err := tb.readDockerHost(i); err != nil {
			return err
		}
	}
	return nil
}

// busyboxImage is a root filesystem tarball with Debian's static busybox
// and the applets the testbed's containers run.
func busyboxImage() ([]byte, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error { h.ModTime = time.Unix(0, 0); return tw.WriteHeader(h) }
	for _, d := range []string{"bin/", "tmp/", "etc/"} {
		if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, a := range []string{"sh", "sleep", "ip", "nc", "cat", "ls"} {
		if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func dockerName(prefix string, h, k int) string { return fmt.Sprintf("%s-h%d-c%d", prefix, h, k) }

// dockerRun starts container k on host h on the overlay network, as
// `docker run -d --network lanes --name NAME IMAGE sleep ...` does, and
// reads back where dockerd put it.
func (tb *Testbed) dockerRun(h, k int) (Container, error) {
	c := newDocker(tb.Config.Prefix, h)
	name := dockerName(tb.Config.Prefix, h, k)
	var created struct {
		ID string `json:"Id"`
	}
	if err := c.call("POST", "/containers/create?name="+url.QueryEscape(name), map[string]any{
		"Image": dockerImage, "Cmd": []string{"sleep", "2147483647"}, "Hostname": name,
		"StopTimeout": 1,
		"HostConfig":  map[string]any{"NetworkMode": dockerNetwork},
	}, &created); err != nil {
		return Container{}, err
	}
	if err := c.call("POST", "/containers/"+created.ID+"/start", nil, nil); err != nil {
		return Container{}, err
	}
	var in struct {
		NetworkSettings struct {
			SandboxKey string
			Networks   map[string]struct {
				IPAddress   string
				IPPrefixLen int
				MacAddress  string
				NetworkID   string
			}
		}
	}
	if err := c.call("GET", "/containers/"+created.ID+"/json", nil, &in); err != nil {
		return Container{}, err
	}
	ep, ok := in.NetworkSettings.Networks[dockerNetwork]
	if !ok || in.NetworkSettings.SandboxKey == "" {
		return Container{}, fmt.Errorf("dockerd h%d started %s without an endpoint on %s", h, name, dockerNetwork)
	}
	ct := Container{Name: fmt.Sprintf("c%d", k), NetNS: in.NetworkSettings.SandboxKey, Veth: "eth0"}
	addr, err := netip.ParseAddr(ep.IPAddress)
	if err != nil {
		return ct, fmt.Errorf("%s's address %q: %w", name, ep.IPAddress, err)
	}
	ct.Addr = netip.PrefixFrom(addr, ep.IPPrefixLen)
	if ct.MAC, err = net.ParseMAC(ep.MacAddress); err != nil {
		return ct, fmt.Errorf("%s's MAC %q: %w", name, ep.MacAddress, err)
	}
	// The interface with the endpoint's MAC is the overlay's (eth0;
	// eth1 is docker_gwbridge's).
	err = nsx.Do(ct.NetNS, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if bytes.Equal(l.Attrs().HardwareAddr, ct.MAC) {
				ct.Veth = l.Attrs().Name
				return nil
			}
		}
		return fmt.Errorf("no interface with %s's MAC %s", name, ct.MAC)
	})
	if err != nil {
		return ct, err
	}
	netID := ep.NetworkID
	if len(netID) > 10 {
		netID = netID[:10]
	}
	overlay := filepath.Join(dockerExecRoot(tb.Config.Prefix, h), "netns", "1-"+netID)
	host := &tb.Hosts[h-1]
	if host.OverlayNetNS == "" {
		host.OverlayNetNS = overlay
	}
	ct.HostVeth, err = hostPeer(overlay, ct.NetNS, ct.Veth)
	return ct, err
}

// hostPeer names the device in namespace host that is the veth peer of
// dev in namespace ns.
func hostPeer(host, ns, dev string) (string, error) {
	var peer int
	if err := nsx.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			peer = l.Attrs().ParentIndex
		}
		return err
	}); err != nil {
		return "", err
	}
	var name string
	err := nsx.Do(host, func() error {
		l, err := netlink.LinkByIndex(peer)
		if err == nil {
			name = l.Attrs().Name
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("%s's peer (ifindex %d) in %s: %w", dev, peer, host, err)
	}
	return name, nil
}

// readDockerHost records host i's overlay as dockerd built it.
func (tb *Testbed) readDockerHost(i int) error {
	h := &tb.Hosts[i]
	if h.OverlayNetNS == "" {
		return fmt.Errorf("dockerd h%d made no overlay namespace (no container attached)", i+1)
	}
	on, err := netns.GetFromPath(h.OverlayNetNS)
	if err != nil {
		return err
	}
	defer on.Close()
	nh, err := netlink.NewHandleAt(on, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		switch l := l.(type) {
		case *netlink.Vxlan:
			h.VXLAN, h.VXLANMAC = l.Name, l.HardwareAddr
			h.VNI, h.Port = uint32(l.VxlanId), l.Port
		case *netlink.Bridge:
			h.Bridge = l.Name
		}
	}
	if h.VXLAN == "" || h.Bridge == "" {
		return fmt.Errorf("dockerd h%d's overlay namespace %s holds no VXLAN device or bridge", i+1, h.OverlayNetNS)
	}
	h.PodSubnet = dockerSubnet
	return nil
}

// dockerRemove removes container ct (number k) from host h, as `docker rm
// -f` does.
func (tb *Testbed) dockerRemove(h, k int) error {
	c := newDocker(tb.Config.Prefix, h)
	err := c.call("DELETE", "/containers/"+url.PathEscape(dockerName(tb.Config.Prefix, h, k))+"?force=1", nil, nil)
	if isNotFound(err) {
		return nil
	}
	return err
}

func networkIDFile(prefix string) string { return filepath.Join(runDir(prefix), "docker-network.id") }

// Two of dockerd's paths ignore data-root and exec-root: each overlay
// network's load-balancer sandbox files (/var/lib/docker/network/files/
// lb_ID) and the plugin socket directory (/run/docker/plugins). Down
// removes the testbed network's files and those directories when nothing
// else is left in them (a host's own dockerd keeps its own there).
var dockerShared = struct{ lbFiles, plugins string }{"/var/lib/docker/network/files", "/run/docker/plugins"}

func cleanDockerShared(prefix string) {
	if id, err := os.ReadFile(networkIDFile(prefix)); err == nil && len(id) > 0 && !strings.ContainsAny(string(id), "/.") {
		os.RemoveAll(filepath.Join(dockerShared.lbFiles, "lb_"+string(id)))
	}
	for _, d := range []string{dockerShared.lbFiles, filepath.Dir(dockerShared.lbFiles), filepath.Dir(filepath.Dir(dockerShared.lbFiles)), dockerShared.plugins, filepath.Dir(dockerShared.plugins)} {
		os.Remove(d) // only when empty
	}
}
