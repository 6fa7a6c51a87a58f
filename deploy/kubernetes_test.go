package deploy_test

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/lanesnet/lanes/cmd/lanes/cli"
	"github.com/lanesnet/lanes/cmd/lanes/config"
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
	return onlyContainer(t, ds, "lanes")
}

// onlyContainer is ds's one container, which must be called name.
func onlyContainer(t *testing.T, ds *appsv1.DaemonSet, name string) *corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != name {
		t.Fatalf("%s: containers %v: want one, %s", ds.Name, cs, name)
	}
	return &cs[0]
}

// The DaemonSet runs lanes agent on the ConfigMap's file in the node's
// network and PID namespaces, unprivileged, with the capabilities lanes
// needs (TestCapabilities) and no other, from an image pinned by digest;
// a restarted container (a liveness kill) keeps the mode: on-exit is keep
// and no hook resets.
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
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 10 {
		t.Errorf("terminationGracePeriodSeconds %v: the agent puts the static placement back on SIGTERM and needs the time", g)
	}
	if c.Agent.OnExit != config.OnExitKeep {
		t.Errorf("the ConfigMap's on-exit is %s: a liveness kill would reset the node under load (keep, and uninstall.yaml resets)", c.Agent.OnExit)
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

	if ctr.Lifecycle != nil && ctr.Lifecycle.PreStop != nil {
		t.Errorf("a preStop hook %+v: the kubelet runs it for a liveness kill too", ctr.Lifecycle.PreStop)
	}
	checkSecurity(t, "daemonset.yaml", ctr, ds.Spec.Template.Annotations)
	if strings.Contains(string(raw), "privileged: true") {
		t.Error("privileged: true in the manifest")
	}
	checkPinned(t, "daemonset.yaml", ctr.Image)
}

// checkSecurity: not privileged, every capability dropped but lanesCaps,
// the runtime's seccomp profile, and no AppArmor (which forbids mount),
// said both by the field and by the pod's annotation (annotations), which
// API servers before Kubernetes 1.30 read instead.
func checkSecurity(t *testing.T, what string, ctr *corev1.Container, annotations map[string]string) {
	t.Helper()
	sc := ctr.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("%s: %s has no securityContext with capabilities", what, ctr.Name)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: %s is privileged: lanesCaps suffice", what, ctr.Name)
	}
	var add []string
	for _, c := range sc.Capabilities.Add {
		add = append(add, string(c))
	}
	slices.Sort(add)
	if !slices.Equal(add, lanesCaps) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s: %s adds %v and drops %v, want exactly %v (TestCapabilities) and every other dropped", what, ctr.Name, add, sc.Capabilities.Drop, lanesCaps)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: %s seccomp %+v, want RuntimeDefault", what, ctr.Name, sc.SeccompProfile)
	}
	if sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined {
		t.Errorf("%s: %s AppArmor %+v: the runtime's default profile forbids the mounts lanes makes", what, ctr.Name, sc.AppArmorProfile)
	}
	if k := corev1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + ctr.Name; annotations[k] != corev1.DeprecatedAppArmorBetaProfileNameUnconfined {
		t.Errorf("%s: annotation %s is %q, want %s: API servers before 1.30 drop appArmorProfile", what, k, annotations[k], corev1.DeprecatedAppArmorBetaProfileNameUnconfined)
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		t.Errorf("%s: %s: the API server refuses allowPrivilegeEscalation false beside CAP_SYS_ADMIN", what, ctr.Name)
	}
}

// An image named by digest: every node runs the same one, whatever a tag
// points at later.
var pinnedImage = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9./_-]+@sha256:[0-9a-f]{64}$`)

func checkPinned(t *testing.T, what, image string) {
	t.Helper()
	if !pinnedImage.MatchString(image) {
		t.Errorf("%s: image %s is not pinned by digest (REGISTRY/NAME@sha256:...)", what, image)
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
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Errorf("metrics-addr %s: the agent's plain HTTP must stay on the node's loopback (kube-rbac-proxy serves it outside)", c.Agent.MetricsAddr)
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
		if g.Path != pr.path || g.Port.String() != "metrics" || g.Host != host {
			t.Errorf("%s probe: %s on %s (host %q), want %s on metrics at %s, where the agent listens", pr.what, g.Path, g.Port.String(), g.Host, pr.path, host)
		}
	}
	// Liveness fails only after the agent's own staleness (5 s) has been
	// seen several times.
	if l := ctr.LivenessProbe; l.PeriodSeconds*l.FailureThreshold < 15 {
		t.Errorf("liveness gives up after %d s", l.PeriodSeconds*l.FailureThreshold)
	}
	if a := ds.Spec.Template.Annotations; a["prometheus.io/scrape"] != "" {
		t.Errorf("scrape annotations %v: nobody reaches the node's loopback", a)
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
		{"/sys/fs/bpf", corev1.MountPropagationHostToContainer},
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
// selects the DaemonSet's pods and scrapes the kube-rbac-proxy sidecar's
// port over TLS: the agent's own port is on the node's loopback.
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
				Port   string `json:"port"`
				Path   string `json:"path"`
				Scheme string `json:"scheme"`
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
	_, proxy := proxyPatch(t)
	if len(pm.Spec.Endpoints) != 1 || pm.Spec.Endpoints[0].Path != "/metrics" || pm.Spec.Endpoints[0].Scheme != "https" ||
		!slices.ContainsFunc(proxy.Ports, func(p corev1.ContainerPort) bool { return p.Name == pm.Spec.Endpoints[0].Port }) {
		t.Errorf("endpoints %+v: want /metrics over https on a port of the kube-rbac-proxy sidecar", pm.Spec.Endpoints)
	}
}

// proxyPatch is metrics-proxy-patch.yaml (a patch of the DaemonSet) and
// its one container, the kube-rbac-proxy sidecar.
func proxyPatch(t *testing.T) (*appsv1.DaemonSet, *corev1.Container) {
	t.Helper()
	var patch appsv1.DaemonSet
	decode(t, "kubernetes/metrics-proxy-patch.yaml", &patch)
	ds, _, _, _ := manifests(t)
	if patch.Name != ds.Name || patch.Namespace != ds.Namespace {
		t.Errorf("the patch is of %s/%s, the DaemonSet %s/%s", patch.Namespace, patch.Name, ds.Namespace, ds.Name)
	}
	return &patch, onlyContainer(t, &patch, "kube-rbac-proxy")
}

// The kube-rbac-proxy sidecar serves the agent's loopback endpoint (the
// ConfigMap's metrics-addr) to authenticated clients only, unprivileged,
// under the service account metrics-proxy-rbac.yaml lets review tokens.
func TestMetricsProxy(t *testing.T) {
	_, _, _, c := manifests(t)
	patch, proxy := proxyPatch(t)
	checkPinned(t, "metrics-proxy-patch.yaml", proxy.Image)
	if !slices.Contains(proxy.Args, "--upstream=http://"+c.Agent.MetricsAddr+"/") || !slices.Contains(proxy.Args, "--allow-paths=/metrics") {
		t.Errorf("kube-rbac-proxy args %q: want --upstream=http://%s/ and --allow-paths=/metrics", proxy.Args, c.Agent.MetricsAddr)
	}
	if sc := proxy.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("kube-rbac-proxy securityContext %+v: want non-root, every capability dropped", sc)
	}
	sa := patch.Spec.Template.Spec.ServiceAccountName
	b, err := os.ReadFile("kubernetes/metrics-proxy-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	var acct corev1.ServiceAccount
	var role rbacv1.ClusterRole
	var bind rbacv1.ClusterRoleBinding
	for i, v := range []any{&acct, &role, &bind} {
		if i >= len(docs) {
			t.Fatalf("metrics-proxy-rbac.yaml: %d documents, want 3", len(docs))
		}
		if err := yaml.UnmarshalStrict([]byte(docs[i]), v); err != nil {
			t.Fatalf("metrics-proxy-rbac.yaml document %d: %v", i+1, err)
		}
	}
	if acct.Name != sa || acct.Namespace != patch.Namespace || bind.RoleRef.Name != role.Name ||
		len(bind.Subjects) != 1 || bind.Subjects[0].Name != sa || bind.Subjects[0].Namespace != patch.Namespace {
		t.Errorf("the service account %s/%s, bound to %s, is not the sidecar's %s", acct.Namespace, acct.Name, bind.RoleRef.Name, sa)
	}
	var verbs []string
	for _, r := range role.Rules {
		verbs = append(verbs, strings.Join(r.Resources, ",")+":"+strings.Join(r.Verbs, ","))
	}
	if !slices.Equal(verbs, []string{"tokenreviews:create", "subjectaccessreviews:create"}) {
		t.Errorf("the proxy's role grants %v: want token and access reviews, nothing else", verbs)
	}
}

// The uninstall DaemonSet resets every node with lanes reset --all, from
// the agents' image, capabilities and state, then waits to be deleted.
func TestUninstall(t *testing.T) {
	ds, _, _, c := manifests(t)
	var un appsv1.DaemonSet
	decode(t, "kubernetes/uninstall.yaml", &un)
	spec := un.Spec.Template.Spec
	if !spec.HostNetwork || !spec.HostPID || un.Namespace != ds.Namespace {
		t.Errorf("hostNetwork %v, hostPID %v, namespace %s: the agents' node, not %s", spec.HostNetwork, spec.HostPID, un.Namespace, ds.Namespace)
	}
	for k, v := range un.Spec.Selector.MatchLabels {
		if un.Spec.Template.Labels[k] != v || ds.Spec.Template.Labels[k] == v {
			t.Errorf("selector %s=%s: must select the uninstall pods, not the agents", k, v)
		}
	}
	agent := lanesContainer(t, ds)
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("%d init containers, %d containers: want the reset and the one that waits", len(spec.InitContainers), len(spec.Containers))
	}
	for _, w := range []struct {
		ctr  *corev1.Container
		args []string
	}{{&spec.InitContainers[0], []string{"reset", "--all"}}, {&spec.Containers[0], []string{"reset", "--all", "--wait"}}} {
		ctr := w.ctr
		if ctr.Image != agent.Image || !slices.Equal(ctr.Command, append([]string{"/lanes"}, w.args...)) {
			t.Errorf("%s runs %s %q, want the agents' image %s with /lanes %q", ctr.Name, ctr.Image, ctr.Command, agent.Image, w.args)
		}
		cmd, rest, err := cli.NewRoot().Find(w.args)
		if err != nil || cmd.Name() != "reset" || cmd.ParseFlags(rest) != nil {
			t.Errorf("lanes refuses %q: %v", w.args, err)
		}
		checkSecurity(t, "uninstall.yaml", ctr, un.Spec.Template.Annotations)
		mounts := map[string]corev1.VolumeMount{}
		for _, m := range ctr.VolumeMounts {
			mounts[m.MountPath] = m
		}
		for _, m := range agent.VolumeMounts {
			if m.Name == "config" {
				continue
			}
			if got, ok := mounts[m.MountPath]; !ok || !equalPropagation(got, m) {
				t.Errorf("%s: mount %s %+v, want the agent's %+v", ctr.Name, m.MountPath, got, m)
			}
		}
		if _, ok := mounts[c.StateDir]; !ok {
			t.Errorf("%s: the state dir %s is not mounted", ctr.Name, c.StateDir)
		}
	}
}

// The documented uninstall (uninstall.yaml's header, docs/deploy.md)
// deletes the agents' DaemonSet in the foreground: kubectl returns once
// their pods are gone, and the reset, which refuses a target whose agent
// runs, finds none.
func TestUninstallProcedure(t *testing.T) {
	for _, path := range []string{"kubernetes/uninstall.yaml", "../docs/deploy.md"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.Contains(l, "delete daemonset lanes") {
				continue
			}
			n++
			if !strings.Contains(l, "--cascade=foreground") {
				t.Errorf("%s: %q: the agents' pods may still run when it returns; delete with --cascade=foreground", path, strings.TrimSpace(l))
			}
		}
		if n == 0 {
			t.Errorf("premise: %s shows how to delete the agents' DaemonSet", path)
		}
	}
}

func equalPropagation(a, b corev1.VolumeMount) bool {
	pa, pb := corev1.MountPropagationMode(""), corev1.MountPropagationMode("")
	if a.MountPropagation != nil {
		pa = *a.MountPropagation
	}
	if b.MountPropagation != nil {
		pb = *b.MountPropagation
	}
	return a.Name == b.Name && pa == pb
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
