package deploy_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/internal/modetest"
	"github.com/lanesnet/lanes/testbed"
)

// The image deploy/Dockerfile describes (FROM scratch, the static binary
// alone) builds on a Docker engine, and `lanes status` runs in it, in a
// container set up as the DaemonSet sets lanes up (but for privileged:
// below): in the node's network and PID namespaces, with Docker's
// namespace directory and bpffs mounted. The engine is the dockerd of the testbed's receiving
// host (overlay dockerd), whose namespace plays the node: status finds the
// overlay that dockerd built there and names its VXLAN device. Skipped,
// saying why, where dockerd is not installed.
func TestImageRunsStatus(t *testing.T) {
	tb := modetest.UpTestbedOverlay(t, testbed.OverlayDockerd)
	prefix, h := tb.Config.Prefix, 2
	call := func(method, path string, body any) []byte {
		t.Helper()
		b, err := testbed.DockerCall(prefix, h, method, path, body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	bin := filepath.Join(t.TempDir(), "lanes")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/lanesnet/lanes/cmd/lanes")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the static binary: %v\n%s", err, out)
	}
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// The build context make image sends: the repository root, of which
	// the Dockerfile copies bin/lanes alone.
	context := tarOf(t, map[string]string{"deploy/Dockerfile": string(dockerfile)}, map[string]string{"bin/lanes": bin})
	const image = "lanes-test/lanes:dev"
	q := url.Values{"dockerfile": {"deploy/Dockerfile"}, "t": {image}, "rm": {"1"}, "forcerm": {"1"}}
	for _, line := range bytes.Split(call("POST", "/build?"+q.Encode(), bytes.NewReader(context)), []byte("\n")) {
		var msg struct{ Error string }
		if json.Unmarshal(line, &msg) == nil && msg.Error != "" {
			t.Fatalf("docker build -f deploy/Dockerfile: %s", msg.Error)
		}
	}

	var created struct{ ID string }
	if err := json.Unmarshal(call("POST", "/containers/create", map[string]any{
		"Image": image, "Cmd": []string{"status"}, "Tty": true,
		"HostConfig": map[string]any{
			// Not privileged, as the DaemonSet is (for sysctl
			// writes and bpffs mount propagation, which status does
			// not need): a privileged container asks for every
			// capability, and runc fails where the machine's bounding
			// set lacks one (these VMs lack CAP_SYS_RESOURCE). These
			// are the ones status uses: entering and mounting in other
			// namespaces, reading BPF maps and programs (CAP_SYS_ADMIN:
			// Debian 12's Docker predates CAP_BPF), reading other
			// processes' namespaces.
			"CapAdd":      []string{"SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"},
			"SecurityOpt": []string{"seccomp=unconfined", "apparmor=unconfined"},
			"NetworkMode": "host", "PidMode": "host",
			"Binds": []string{
				testbed.DockerNetNSDir(prefix, h) + ":/var/run/docker/netns",
				"/sys/fs/bpf:/sys/fs/bpf",
			},
		},
	}), &created); err != nil || created.ID == "" {
		t.Fatalf("creating the container: %v", err)
	}
	t.Cleanup(func() { testbed.DockerCall(prefix, h, "DELETE", "/containers/"+created.ID+"?force=1", nil) })
	call("POST", "/containers/"+created.ID+"/start", nil)
	var exit struct{ StatusCode int }
	if err := json.Unmarshal(call("POST", "/containers/"+created.ID+"/wait", nil), &exit); err != nil {
		t.Fatal(err)
	}
	out := string(call("GET", "/containers/"+created.ID+"/logs?stdout=1&stderr=1", nil))
	t.Logf("lanes status in the image (exit %d):\n%s", exit.StatusCode, out)
	if exit.StatusCode != 0 {
		t.Errorf("lanes status exited %d in the image", exit.StatusCode)
	}
	if vx := tb.Receiver().VXLAN; !strings.Contains(out, vx) {
		t.Errorf("lanes status in the image does not name the overlay's VXLAN device %s", vx)
	}
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
