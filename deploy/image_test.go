package deploy_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/testbed"
)

// The image deploy/Dockerfile describes (FROM scratch, the static binary
// alone) builds on a Docker engine, and `lanes status` runs in it, in the
// node's network and PID namespaces, with Docker's namespace directory and
// bpffs mounted. The engine is the dockerd of the testbed's receiving host
// (overlay dockerd), whose namespace plays the node: status finds the
// overlay that dockerd built there and names its VXLAN device. Skipped,
// saying why, where dockerd is not installed.
func TestImageRunsStatus(t *testing.T) {
	tb := modetest.UpTestbedOverlay(t, testbed.OverlayDockerd)
	d := dockerOf(t, tb, 2)
	image := d.build(t)
	out, rc := d.run(t, map[string]any{
		"Image": image, "Cmd": []string{"status"}, "Tty": true,
		"HostConfig": map[string]any{
			// Not as the DaemonSet runs it (TestImageRunsAgent does):
			// Debian 12's Docker predates CAP_BPF, and status reads BPF
			// maps and programs, which CAP_SYS_ADMIN also grants. These
			// are the ones status uses: entering and mounting in other
			// namespaces, reading BPF maps and programs, reading other
			// processes' namespaces.
			"CapAdd":      []string{"SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"},
			"SecurityOpt": []string{"seccomp=unconfined", "apparmor=unconfined"},
			"NetworkMode": "host", "PidMode": "host",
			"Binds": []string{
				testbed.DockerNetNSDir(d.prefix, d.h) + ":/var/run/docker/netns",
				"/sys/fs/bpf:/sys/fs/bpf",
			},
		},
	})
	t.Logf("lanes status in the image (exit %d):\n%s", rc, out)
	if rc != 0 {
		t.Errorf("lanes status exited %d in the image", rc)
	}
	if vx := tb.Receiver().VXLAN; !strings.Contains(out, vx) {
		t.Errorf("lanes status in the image does not name the overlay's VXLAN device %s", vx)
	}
}

// The DaemonSet's lifecycle, in a real container runtime (the testbed's
// receiving dockerd plays the node: its namespace the node's network,
// runc and Docker's default seccomp profile the kubelet's runtime), with
// the DaemonSet's security context: not privileged, every capability
// dropped but the manifest's. The agent applies the ConfigMap's file
// (sysfs and /proc/sys writes, both read-only in the container), a stop
// (the kubelet's SIGTERM, as a liveness kill sends it) leaves the mode
// applied, the next container picks it up, and uninstall.yaml's command
// resets the node to what it was.
func TestImageRunsAgent(t *testing.T) {
	tb := modetest.UpTestbedOverlay(t, testbed.OverlayDockerd)
	d := dockerOf(t, tb, 2)
	image := d.build(t)
	ds, _, cm, cfg := manifests(t)
	ctr := lanesContainer(t, ds)
	var un appsv1.DaemonSet
	decode(t, "kubernetes/uninstall.yaml", &un)
	before := modetest.Snapshot(t, tb)

	conf := t.TempDir()
	if err := os.WriteFile(filepath.Join(conf, "lanes.yaml"), []byte(cm.Data["lanes.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	t.Cleanup(func() { control.ResetAll(state) })
	host := func(c *corev1.Container) map[string]any {
		var add []string
		for _, c := range c.SecurityContext.Capabilities.Add {
			add = append(add, string(c))
		}
		// The binds are private, not HostToContainer (rslave), which
		// Docker refuses where the source is no shared mount (a machine
		// without systemd): it matters only for mounts made after the
		// container started, and the test makes none.
		return map[string]any{
			"CapDrop": []string{"ALL"}, "CapAdd": add,
			"NetworkMode": "host", "PidMode": "host",
			"Binds": []string{
				testbed.DockerNetNSDir(d.prefix, d.h) + ":/var/run/docker/netns",
				"/sys/fs/bpf:/sys/fs/bpf",
				state + ":" + cfg.StateDir,
				conf + ":/etc/lanes:ro",
			},
		}
	}
	agent := func(want string) {
		t.Helper()
		id := d.start(t, map[string]any{"Image": image, "Entrypoint": ctr.Command, "Cmd": []string{}, "Tty": true, "HostConfig": host(ctr)})
		if !waitFor(func() bool { return strings.Contains(d.logs(t, id), "running (on exit: keep)") }) {
			t.Fatalf("the agent never ran:\n%s", d.logs(t, id))
		}
		if out := d.logs(t, id); !strings.Contains(out, want) {
			t.Errorf("the agent did not say %q:\n%s", want, out)
		}
		d.call(t, "POST", "/containers/"+id+"/stop?t=25", nil)
		out, rc := d.wait(t, id)
		t.Logf("the agent, stopped (exit %d):\n%s", rc, out)
		if rc != 0 || !strings.Contains(out, "mode still applied") {
			t.Errorf("the stopped agent exited %d, or reset: want the mode kept", rc)
		}
		if ents, _ := os.ReadDir(state); len(ents) == 0 {
			t.Error("the stopped agent left no state: its mode is gone")
		}
	}
	agent("applied " + cfg.Mode)
	agent("picked up " + cfg.Mode)

	reset := &un.Spec.Template.Spec.InitContainers[0]
	out, rc := d.run(t, map[string]any{"Image": image, "Entrypoint": reset.Command, "Cmd": []string{}, "Tty": true, "HostConfig": host(reset)})
	t.Logf("uninstall's reset (exit %d):\n%s", rc, out)
	if rc != 0 || !strings.Contains(out, "restored") {
		t.Errorf("uninstall's reset exited %d without restoring", rc)
	}
	modetest.NoState(t, state)
	modetest.SameSnapshot(t, "after uninstall", modetest.Snapshot(t, tb), before)
}

// dockerd is the testbed's dockerd on host h, through its API.
type dockerd struct {
	prefix string
	h      int
}

func dockerOf(t *testing.T, tb *testbed.Testbed, h int) *dockerd {
	return &dockerd{tb.Config.Prefix, h}
}

func (d *dockerd) call(t *testing.T, method, path string, body any) []byte {
	t.Helper()
	b, err := testbed.DockerCall(d.prefix, d.h, method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// build builds deploy/Dockerfile's image around a fresh static binary.
func (d *dockerd) build(t *testing.T) string {
	t.Helper()
	bin := buildLanes(t)
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// The build context make image sends: the repository root, of which
	// the Dockerfile copies bin/lanes alone.
	context := tarOf(t, map[string]string{"deploy/Dockerfile": string(dockerfile)}, map[string]string{"bin/lanes": bin})
	const image = "lanes-test/lanes:dev"
	q := url.Values{"dockerfile": {"deploy/Dockerfile"}, "t": {image}, "rm": {"1"}, "forcerm": {"1"}}
	for _, line := range bytes.Split(d.call(t, "POST", "/build?"+q.Encode(), bytes.NewReader(context)), []byte("\n")) {
		var msg struct{ Error string }
		if json.Unmarshal(line, &msg) == nil && msg.Error != "" {
			t.Fatalf("docker build -f deploy/Dockerfile: %s", msg.Error)
		}
	}
	return image
}

// start creates and starts a container, removed when the test ends.
func (d *dockerd) start(t *testing.T, spec map[string]any) string {
	t.Helper()
	var created struct{ ID string }
	if err := json.Unmarshal(d.call(t, "POST", "/containers/create", spec), &created); err != nil || created.ID == "" {
		t.Fatalf("creating the container: %v", err)
	}
	t.Cleanup(func() { testbed.DockerCall(d.prefix, d.h, "DELETE", "/containers/"+created.ID+"?force=1", nil) })
	d.call(t, "POST", "/containers/"+created.ID+"/start", nil)
	return created.ID
}

func (d *dockerd) logs(t *testing.T, id string) string {
	return string(d.call(t, "GET", "/containers/"+id+"/logs?stdout=1&stderr=1", nil))
}

// wait waits for a container to exit: its output and exit status.
func (d *dockerd) wait(t *testing.T, id string) (string, int) {
	t.Helper()
	var exit struct{ StatusCode int }
	if err := json.Unmarshal(d.call(t, "POST", "/containers/"+id+"/wait", nil), &exit); err != nil {
		t.Fatal(err)
	}
	return d.logs(t, id), exit.StatusCode
}

// run runs a container to its end.
func (d *dockerd) run(t *testing.T, spec map[string]any) (string, int) {
	t.Helper()
	return d.wait(t, d.start(t, spec))
}

// waitFor polls cond for up to two minutes.
func waitFor(cond func() bool) bool {
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// tarOf is a build context: files given by content and files copied from
// the host, under their names in the context.
func tarOf(t *testing.T, content, copied map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, mode int64, data []byte) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	for name, s := range content {
		add(name, 0o644, []byte(s))
	}
	for name, path := range copied {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		add(name, 0o755, data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
