package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/infermesh/infermesh/node"
)

// The deployment files cannot be built or applied on a test machine; these
// tests hold them to the binary they deploy: every flag they pass is a
// real `infermesh serve` flag, every SERVICE_* variable a real one, and
// the Kubernetes objects parse into the Kubernetes API types with the
// probes, ports and volume the node needs.

const repoRoot = "../.."

// serveFlagSet is the flag names and SERVICE_* variables of `infermesh
// serve`, from the binary's own flag set.
func serveFlagSet(t *testing.T) (flags, envs map[string]bool) {
	t.Helper()
	cfg := node.Defaults()
	lvl := "info"
	f := serveFlags(&cfg, &lvl)
	flags, envs = map[string]bool{}, map[string]bool{}
	for _, r := range f.rows {
		flags[r[0]] = true
		envs[r[1]] = true
	}
	// Read by the node itself, not a flag: the admin key stays out of
	// process listings.
	envs["SERVICE_ADMIN_KEY"] = true
	return flags, envs
}

var flagToken = regexp.MustCompile(`^--([a-z0-9][a-z0-9-]*)(=.*)?$`)

// checkArgs fails for every --flag in args that `infermesh serve` lacks; it
// returns the flag names found.
func checkArgs(t *testing.T, where string, args []string, flags map[string]bool) []string {
	t.Helper()
	var seen []string
	for _, a := range args {
		m := flagToken.FindStringSubmatch(a)
		if m == nil {
			continue
		}
		if !flags[m[1]] {
			t.Errorf("%s: --%s is not a flag of infermesh serve", where, m[1])
		}
		seen = append(seen, m[1])
	}
	return seen
}

func readRepo(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// yamlDocs splits a multi-document YAML file.
func yamlDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func TestKubernetesManifests(t *testing.T) {
	flags, envs := serveFlagSet(t)
	var sts appsv1.StatefulSet
	if err := yaml.UnmarshalStrict(readRepo(t, "deploy/kubernetes/statefulset.yaml"), &sts); err != nil {
		t.Fatalf("statefulset.yaml: %v", err)
	}
	if sts.Kind != "StatefulSet" || sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Fatalf("StatefulSet kind %q replicas %v", sts.Kind, sts.Spec.Replicas)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: the pods must start together for --bootstrap-expect", sts.Spec.PodManagementPolicy)
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("container args %v: want serve ...", c.Args)
	}
	used := checkArgs(t, "statefulset", c.Args, flags)
	for _, want := range []string{"listen", "advertise", "join", "bootstrap-expect", "data-dir", "drain-timeout"} {
		if !slices.Contains(used, want) {
			t.Errorf("statefulset: no --%s", want)
		}
	}
	arg := func(name string) string {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	if arg("listen") != "0.0.0.0:8080" || arg("advertise") != "$(POD_IP)" || arg("bootstrap-expect") != "3" {
		t.Errorf("listen %q advertise %q bootstrap-expect %q", arg("listen"), arg("advertise"), arg("bootstrap-expect"))
	}
	// The join name is the headless Service, which must publish pods
	// before they are ready.
	joinHost := strings.Split(arg("join"), ":")[0]
	var httpPort int32
	for _, p := range c.Ports {
		if p.Name == "http" {
			httpPort = p.ContainerPort
		}
	}
	if httpPort != 8080 {
		t.Errorf("http container port %d, want 8080 (--listen)", httpPort)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no HTTP probe", name)
			return
		}
		if p.HTTPGet.Path != path || (p.HTTPGet.Port.String() != "http" && p.HTTPGet.Port.IntValue() != 8080) {
			t.Errorf("%s probe %s on %s, want %s on http (8080)", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/livez")
	envNames := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		envNames[e.Name] = e
		if strings.HasPrefix(e.Name, "SERVICE_") && !envs[e.Name] {
			t.Errorf("statefulset: %s is not a variable of infermesh serve", e.Name)
		}
	}
	for _, name := range []string{"SERVICE_CLUSTER_SECRET", "SERVICE_ADMIN_KEY"} {
		if e, ok := envNames[name]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s must come from a Secret", name)
		}
	}
	if e := envNames["POD_IP"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP must be the pod IP (for --advertise)")
	}
	// The data directory is the PVC.
	dataDir := arg("data-dir")
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == dataDir {
			mounted = true
			if len(sts.Spec.VolumeClaimTemplates) == 0 || sts.Spec.VolumeClaimTemplates[0].Name != m.Name {
				t.Errorf("data dir mount %q is not the volume claim template", m.Name)
			}
		}
	}
	if !mounted || dataDir == "" {
		t.Errorf("--data-dir %q is not a mounted volume", dataDir)
	}
	// Graceful stop: preStop + drain fit in the grace period.
	drain := arg("drain-timeout")
	if pod.TerminationGracePeriodSeconds == nil || c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("no terminationGracePeriodSeconds or preStop sleep")
	}
	d, err := parseDurationSeconds(drain)
	if err != nil {
		t.Fatalf("--drain-timeout %q: %v", drain, err)
	}
	if grace, pre := *pod.TerminationGracePeriodSeconds, c.Lifecycle.PreStop.Sleep.Seconds; grace < pre+d+5 {
		t.Errorf("terminationGracePeriodSeconds %d < preStop %d + drain %d + 5", grace, pre, d)
	}
	for _, ic := range pod.InitContainers {
		if !slices.ContainsFunc(ic.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "data" && m.MountPath == dataDir }) {
			t.Errorf("init container %s does not mount the data directory", ic.Name)
		}
	}

	// Services: a headless one publishing not-ready pods, named by --join.
	var headless *corev1.Service
	for _, doc := range yamlDocs(readRepo(t, "deploy/kubernetes/service.yaml")) {
		var svc corev1.Service
		if err := yaml.UnmarshalStrict(doc, &svc); err != nil {
			t.Fatalf("service.yaml: %v", err)
		}
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			headless = &svc
		}
	}
	if headless == nil || headless.Name != joinHost || headless.Name != sts.Spec.ServiceName {
		t.Fatalf("no headless Service named %q (the --join host and serviceName %q)", joinHost, sts.Spec.ServiceName)
	}
	if !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("headless Service must publish not-ready pods: they find each other before any is ready")
	}
	var pdb policyv1.PodDisruptionBudget
	if err := yaml.UnmarshalStrict(readRepo(t, "deploy/kubernetes/pdb.yaml"), &pdb); err != nil {
		t.Fatalf("pdb.yaml: %v", err)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
	var secret corev1.Secret
	if err := yaml.UnmarshalStrict(readRepo(t, "deploy/kubernetes/secret.yaml"), &secret); err != nil {
		t.Fatalf("secret.yaml: %v", err)
	}
	for _, name := range []string{"SERVICE_CLUSTER_SECRET", "SERVICE_ADMIN_KEY"} {
		ref := envNames[name].ValueFrom.SecretKeyRef
		if ref.Name != secret.Name || secret.StringData[ref.Key] == "" {
			t.Errorf("%s refers to %s/%s, not in secret.yaml", name, ref.Name, ref.Key)
		}
	}
}

// parseDurationSeconds reads a Go duration as whole seconds.
func parseDurationSeconds(s string) (int64, error) {
	var cfg node.Config
	lvl := ""
	f := serveFlags(&cfg, &lvl)
	if err := f.fs.Set("drain-timeout", s); err != nil {
		return 0, err
	}
	return int64(cfg.DrainTimeout.Seconds()), nil
}

func TestDockerfile(t *testing.T) {
	flags, envs := serveFlagSet(t)
	// One instruction a line: continuation lines joined.
	b := regexp.MustCompile(`\\\n\s*`).ReplaceAll(readRepo(t, "Dockerfile"), []byte(" "))
	var stage string
	var buildRuns []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	var cmd []string
	exposed := map[string]bool{}
	health := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "FROM "):
			if f := strings.Fields(line); len(f) >= 4 && strings.EqualFold(f[2], "AS") {
				stage = f[3]
			}
		case strings.HasPrefix(line, "RUN ") && stage == "build":
			buildRuns = append(buildRuns, line)
		case strings.HasPrefix(line, "CMD "):
			cmd = jsonArgs(t, strings.TrimPrefix(line, "CMD "))
		case strings.HasPrefix(line, "EXPOSE "):
			for _, p := range strings.Fields(line)[1:] {
				exposed[strings.Split(p, "/")[0]] = true
			}
		case strings.HasPrefix(line, "HEALTHCHECK "):
			health += line
		case strings.HasPrefix(line, "USER "):
			if strings.HasPrefix(strings.Fields(line)[1], "0") || strings.Fields(line)[1] == "root" {
				t.Errorf("runs as root: %s", line)
			}
		}
		for _, m := range regexp.MustCompile(`\bSERVICE_[A-Z_]+`).FindAllString(line, -1) {
			if !envs[m] {
				t.Errorf("Dockerfile: %s is not a variable of infermesh serve", m)
			}
		}
	}
	if !regexp.MustCompile(`\bmake build\b`).MatchString(strings.Join(buildRuns, "\n")) {
		t.Errorf("the build stage does not run `make build`: %v", buildRuns)
	}
	if !strings.Contains(strings.Join(buildRuns, "\n"), "make assets") {
		t.Errorf("the build stage does not run `make assets`")
	}
	// `make build` is the Makefile's go build of the command.
	mk := string(readRepo(t, "Makefile"))
	if !regexp.MustCompile(`(?m)^build:( deps)?\n\tgo build \$\(GOFLAGS_LD\) -o \$\(BIN\) \./cmd/infermesh$`).MatchString(mk) {
		t.Errorf("the Makefile's build target is not the go build the Dockerfile relies on")
	}
	if len(cmd) == 0 || cmd[0] != "serve" {
		t.Fatalf("CMD %v: want serve ...", cmd)
	}
	checkArgs(t, "Dockerfile CMD", cmd, flags)
	if !strings.Contains(strings.Join(cmd, " "), "--listen 0.0.0.0:11436") {
		t.Errorf("CMD %v does not listen on 0.0.0.0:11436", cmd)
	}
	for _, p := range []string{"11436", "7946", "7947"} {
		if !exposed[p] {
			t.Errorf("port %s not exposed", p)
		}
	}
	if !strings.Contains(health, "http://127.0.0.1:11436/readyz") {
		t.Errorf("HEALTHCHECK %q does not probe /readyz", health)
	}
}

// jsonArgs parses an exec-form instruction (["a", "b"]).
func jsonArgs(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	if err := yaml.Unmarshal([]byte(s), &out); err != nil {
		t.Fatalf("exec form %s: %v", s, err)
	}
	return out
}

func TestSystemdUnit(t *testing.T) {
	flags, envs := serveFlagSet(t)
	b := string(readRepo(t, "deploy/systemd/infermesh.service"))
	var exec []string
	for _, line := range strings.Split(b, "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			exec = strings.Fields(v)
		}
	}
	if len(exec) < 2 || exec[1] != "serve" {
		t.Fatalf("ExecStart %v: want infermesh serve ...", exec)
	}
	used := checkArgs(t, "ExecStart", exec[2:], flags)
	if !slices.Contains(used, "data-dir") || !slices.Contains(used, "drain-timeout") {
		t.Errorf("ExecStart lacks --data-dir or --drain-timeout: %v", exec)
	}
	for _, m := range regexp.MustCompile(`\bSERVICE_[A-Z_]+`).FindAllString(b, -1) {
		if !envs[m] {
			t.Errorf("systemd unit: %s is not a variable of infermesh serve", m)
		}
	}
	if !strings.Contains(b, "TimeoutStopSec=45s") || !strings.Contains(b, "--drain-timeout 30s") {
		t.Errorf("TimeoutStopSec must outlast --drain-timeout")
	}
}
