package deploy_test

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/lanesnet/lanes/internal/cli"
	"github.com/lanesnet/lanes/internal/config"
	"github.com/lanesnet/lanes/topology"
)

// decode reads a manifest into a Kubernetes API type, refusing fields the
// type does not have (a misspelt field would otherwise vanish).
func decode(t *testing.T, path string, v any) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

func manifests(t *testing.T) (*appsv1.DaemonSet, []byte, *corev1.ConfigMap, *config.Config) {
	t.Helper()
	var ds appsv1.DaemonSet
	raw := decode(t, "kubernetes/daemonset.yaml", &ds)
	var cm corev1.ConfigMap
	decode(t, "kubernetes/configmap.yaml", &cm)
	text, ok := cm.Data["lanes.yaml"]
	if !ok {
		t.Fatalf("the ConfigMap has no lanes.yaml: %v", cm.Data)
	}
	c, err := config.Parse("configmap.yaml:lanes.yaml", []byte(text))
	if err != nil {
		t.Fatalf("the ConfigMap's configuration is refused:\n%v", err)
	}
	return &ds, raw, &cm, c
}

func lanesContainer(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "lanes" {
		t.Fatalf("containers %v: want one, lanes", cs)
	}
	return &cs[0]
}

// The DaemonSet runs lanes agent on the ConfigMap's file in the node's
// network and PID namespaces, with the capabilities lanes uses, and on
// termination gives the agent time to reset.
func TestDaemonSet(t *testing.T) {
	ds, raw, cm, c := manifests(t)
	if ds.APIVersion != "apps/v1" || ds.Kind != "DaemonSet" || cm.APIVersion != "v1" || cm.Kind != "ConfigMap" {
		t.Errorf("kinds: %s %s, %s %s", ds.APIVersion, ds.Kind, cm.APIVersion, cm.Kind)
	}
	if ds.Namespace != cm.Namespace {
		t.Errorf("DaemonSet in %q, ConfigMap in %q", ds.Namespace, cm.Namespace)
	}
	sel := ds.Spec.Selector.MatchLabels
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("the selector's %s=%s is not on the pod template", k, v)
		}
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || !spec.HostPID {
		t.Errorf("hostNetwork %v, hostPID %v: lanes works on the node's devices and kernel threads", spec.HostNetwork, spec.HostPID)
	}
	if spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %s", spec.DNSPolicy)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Errorf("terminationGracePeriodSeconds %v: the agent resets on SIGTERM and needs the time", g)
	}
	if c.Agent.OnExit != config.OnExitReset {
		t.Errorf("the ConfigMap's on-exit is %s: a terminated pod must reset", c.Agent.OnExit)
	}

	ctr := lanesContainer(t, ds)
	want := []string{"/lanes", "agent", "--config", config.DefaultPath}
	if !slices.Equal(ctr.Command, want) || len(ctr.Args) != 0 {
		t.Errorf("command %q args %q, want %q", ctr.Command, ctr.Args, want)
	}
	cmd, rest, err := cli.NewRoot().Find(ctr.Command[1:])
	if err != nil || cmd.Name() != "agent" {
		t.Fatalf("the command is no lanes agent: %v", err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Errorf("lanes agent refuses %v: %v", rest, err)
	}

	sc := ctr.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no securityContext with capabilities")
	}
	for _, c := range []corev1.Capability{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN", "SYS_NICE", "SYS_PTRACE"} {
		if !slices.Contains(sc.Capabilities.Add, c) {
			t.Errorf("capability %s not listed", c)
		}
	}
	if sc.Privileged != nil && *sc.Privileged && !strings.Contains(string(raw), "privileged is unavoidable") {
		t.Error("privileged without the reason beside it")
	}
}

// The probes reach the agent's health endpoints on the port the
// ConfigMap's agent listens on, at the node's address; Prometheus'
// annotations name the same port.
func TestDaemonSetProbes(t *testing.T) {
	ds, _, _, c := manifests(t)
	ctr := lanesContainer(t, ds)
	host, port, err := net.SplitHostPort(c.Agent.MetricsAddr)
	if err != nil {
		t.Fatalf("metrics-addr %q: %v", c.Agent.MetricsAddr, err)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("metrics-addr %s: the kubelet probes the node's address, not %s", c.Agent.MetricsAddr, host)
	}
	var named *corev1.ContainerPort
	for i, p := range ctr.Ports {
		if p.Name == "metrics" {
			named = &ctr.Ports[i]
		}
	}
	if named == nil || strconv.Itoa(int(named.ContainerPort)) != port {
		t.Fatalf("port metrics %+v, want %s (the agent's)", named, port)
	}
	for _, pr := range []struct {
		what string
		p    *corev1.Probe
		path string
	}{{"liveness", ctr.LivenessProbe, "/healthz"}, {"readiness", ctr.ReadinessProbe, "/readyz"}, {"startup", ctr.StartupProbe, "/healthz"}} {
		if pr.p == nil || pr.p.HTTPGet == nil {
			t.Errorf("%s probe: none over HTTP", pr.what)
			continue
		}
		g := pr.p.HTTPGet
		if g.Path != pr.path || g.Port.String() != "metrics" || g.Host != "" {
			t.Errorf("%s probe: %s on %s (host %q), want %s on metrics", pr.what, g.Path, g.Port.String(), g.Host, pr.path)
		}
	}
	// Liveness fails only after the agent's own staleness (5 s) has been
	// seen several times.
	if l := ctr.LivenessProbe; l.PeriodSeconds*l.FailureThreshold < 15 {
		t.Errorf("liveness gives up after %d s", l.PeriodSeconds*l.FailureThreshold)
	}
	a := ds.Spec.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", a)
	}
}

// The mounts give lanes the node's bpffs, its state directory (the
// ConfigMap's state-dir), the namespace directories it looks in, and the
// ConfigMap at the file the command names.
func TestDaemonSetMounts(t *testing.T) {
	ds, _, cm, c := manifests(t)
	ctr := lanesContainer(t, ds)
	vols := map[string]corev1.Volume{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.MountPath] = m
		if _, ok := vols[m.Name]; !ok {
			t.Errorf("mount %s: no volume %s", m.MountPath, m.Name)
		}
	}
	for _, w := range []struct {
		path        string
		propagation corev1.MountPropagationMode
	}{
		{"/sys/fs/bpf", corev1.MountPropagationBidirectional},
		{c.StateDir, ""},
		{"/run/netns", corev1.MountPropagationHostToContainer},
		{topology.DockerNetNSDir, corev1.MountPropagationHostToContainer},
	} {
		m, ok := mounts[w.path]
		if !ok {
			t.Errorf("no mount at %s", w.path)
			continue
		}
		hp := vols[m.Name].HostPath
		if hp == nil || hp.Path != w.path {
			t.Errorf("mount %s: want the node's %s, got %+v", w.path, w.path, hp)
		}
		got := corev1.MountPropagationMode("")
		if m.MountPropagation != nil {
			got = *m.MountPropagation
		}
		if got != w.propagation {
			t.Errorf("mount %s: propagation %q, want %q", w.path, got, w.propagation)
		}
	}
	m, ok := mounts[filepath.Dir(config.DefaultPath)]
	if !ok || vols[m.Name].ConfigMap == nil || vols[m.Name].ConfigMap.Name != cm.Name {
		t.Errorf("no ConfigMap %s at %s", cm.Name, filepath.Dir(config.DefaultPath))
	}
	if _, ok := cm.Data[filepath.Base(config.DefaultPath)]; !ok {
		t.Errorf("the ConfigMap has no key %s", filepath.Base(config.DefaultPath))
	}
}

// The PodMonitor (the Prometheus Operator's type, not in k8s.io/api)
// selects the DaemonSet's pods and scrapes their metrics port.
func TestPodMonitor(t *testing.T) {
	ds, _, _, _ := manifests(t)
	var pm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port string `json:"port"`
				Path string `json:"path"`
			} `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	b, err := os.ReadFile("kubernetes/podmonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &pm); err != nil {
		t.Fatal(err)
	}
	if pm.APIVersion != "monitoring.coreos.com/v1" || pm.Kind != "PodMonitor" || pm.Metadata.Namespace != ds.Namespace {
		t.Errorf("PodMonitor header: %+v", pm)
	}
	for k, v := range pm.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not select the DaemonSet's pods", k, v)
		}
	}
	if len(pm.Spec.Endpoints) != 1 || pm.Spec.Endpoints[0].Port != "metrics" || pm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("endpoints %+v", pm.Spec.Endpoints)
	}
}

// The image holds the static binary alone, where the DaemonSet runs it.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	want := []string{"FROM scratch", "COPY bin/lanes /lanes", `ENTRYPOINT ["/lanes"]`, `CMD ["agent", "--config", "/etc/lanes/lanes.yaml"]`}
	if !slices.Equal(lines, want) {
		t.Errorf("Dockerfile instructions\n  %s\nwant\n  %s", strings.Join(lines, "\n  "), strings.Join(want, "\n  "))
	}
	ds, _, _, _ := manifests(t)
	if ctr := lanesContainer(t, ds); ctr.Command[0] != "/lanes" {
		t.Errorf("the DaemonSet runs %s, the image has /lanes", ctr.Command[0])
	}
}
