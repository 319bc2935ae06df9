package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// The simultaneous start the StatefulSet does, on real network stacks:
// every node is a process in its own network namespace with one address
// (a veth on a bridge), bound to 0.0.0.0 exactly as the manifest says,
// joining the others through the DNS-style name infermesh-peers (an
// /etc/hosts entry per namespace resolving to all three addresses).
//
// Named namespaces, veths and the bridge are host objects: the lab names
// them after this test process, deletes leftovers of dead test processes
// before it starts, and deletes its own in t.Cleanup whatever the outcome.
// Node processes die with the test process (Pdeathsig).

// netnsLab is the namespaces, veths and bridge of one test.
type netnsLab struct {
	tag    string   // this process's id, in every object name
	bridge string   // bridge in the host namespace
	ns     []string // namespace names
	ips    []string // one address per namespace
	hostIP string   // the host's address on the bridge: the client's
	subnet string   // the first three octets
}

// labPrefix starts every namespace name; labBridge every bridge name.
const (
	labPrefix = "imt"
	labBridge = "imb"
	labVeth   = "imv"
)

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// removeStaleLabs deletes namespaces and bridges left by test processes
// that no longer exist (killed before their cleanup ran).
func removeStaleLabs(t *testing.T) {
	alive := func(name, prefix string) bool {
		rest := strings.TrimPrefix(name, prefix)
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil {
			return true // not ours
		}
		return syscall.Kill(pid, 0) == nil
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], labPrefix) && !alive(f[0], labPrefix) {
			t.Logf("removing stale namespace %s", f[0])
			ipCmd("netns", "del", f[0])
			os.RemoveAll(filepath.Join("/etc/netns", f[0]))
		}
	}
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		for _, p := range []string{labBridge, labVeth} {
			if strings.HasPrefix(ifc.Name, p) && !alive(ifc.Name, p) {
				t.Logf("removing stale link %s", ifc.Name)
				ipCmd("link", "del", ifc.Name)
			}
		}
	}
}

// newNetnsLab makes n namespaces on one bridge, each with lo and one
// address, and an /etc/hosts naming all of them infermesh-peers.
func newNetnsLab(t *testing.T, n int) *netnsLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: it creates network namespaces, veths and a bridge")
	}
	removeStaleLabs(t)
	pid := os.Getpid()
	l := &netnsLab{tag: strconv.Itoa(pid), subnet: fmt.Sprintf("10.213.%d", 20+pid%200)}
	l.bridge = labBridge + l.tag
	l.hostIP = l.subnet + ".254"
	if addrs, _ := net.InterfaceAddrs(); strings.Contains(fmt.Sprint(addrs), l.subnet+".") {
		t.Fatalf("subnet %s.0/24 is already in use on this computer", l.subnet)
	}
	// Cleanup first, so it runs last: after every node process is killed.
	t.Cleanup(l.destroy)
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("link", "add", l.bridge, "type", "bridge")
	must("addr", "add", l.hostIP+"/24", "dev", l.bridge)
	must("link", "set", l.bridge, "up")
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n::1 localhost\n")
	for i := range n {
		ns := fmt.Sprintf("%s%s-%d", labPrefix, l.tag, i)
		ip := fmt.Sprintf("%s.%d", l.subnet, i+1)
		l.ns, l.ips = append(l.ns, ns), append(l.ips, ip)
		fmt.Fprintf(&hosts, "%s infermesh-peers\n%s infermesh-%d\n", ip, ip, i)
	}
	for i, ns := range l.ns {
		veth := fmt.Sprintf("%s%s-%d", labVeth, l.tag, i)
		must("netns", "add", ns)
		must("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("link", "set", veth, "master", l.bridge, "up")
		must("-n", ns, "addr", "add", l.ips[i]+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
		must("-n", ns, "link", "set", "lo", "up")
	}
	for _, ns := range l.ns {
		dir := filepath.Join("/etc/netns", ns)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// addNamespace makes one more namespace on the bridge with the given
// addresses (CIDRs); it is deleted with the lab.
func (l *netnsLab) addNamespace(t *testing.T, cidrs ...string) string {
	t.Helper()
	i := len(l.ns)
	ns := fmt.Sprintf("%s%s-%d", labPrefix, l.tag, i)
	veth := fmt.Sprintf("%s%s-%d", labVeth, l.tag, i)
	l.ns = append(l.ns, ns)
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", veth, "master", l.bridge, "up"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cidrs {
		if err := ipCmd("-n", ns, "addr", "add", c, "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// destroy deletes the namespaces (their veth ends, and so the host ends,
// go with them), the bridge and the hosts files, and reports leftovers.
func (l *netnsLab) destroy() {
	for _, ns := range l.ns {
		ipCmd("netns", "del", ns)
		os.RemoveAll(filepath.Join("/etc/netns", ns))
	}
	ipCmd("link", "del", l.bridge)
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, ns := range l.ns {
		if strings.Contains(string(out), ns) {
			fmt.Fprintf(os.Stderr, "netns lab: namespace %s still exists\n", ns)
		}
	}
	if _, err := net.InterfaceByName(l.bridge); err == nil {
		fmt.Fprintf(os.Stderr, "netns lab: bridge %s still exists\n", l.bridge)
	}
}

// nsProc is a node process in a namespace.
type nsProc struct {
	*proc
	ns, ip string
	args   []string
}

// launchIn runs the binary with args inside namespace ns (ip netns exec
// replaces itself with the binary, so the process is the node) and waits
// until it listens; the client reaches it on ip:8080.
func launchIn(t *testing.T, ns, ip, id string, args []string) *nsProc {
	t.Helper()
	p, err := startIn(ns, id, args)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.listening:
	case <-p.exited:
		t.Fatalf("%s exited before listening: %v\n%s", id, p.err, p.stderr)
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		t.Fatalf("%s did not start listening\n%s", id, p.stderr)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("node %s log:\n%s", id, p.stderr)
		}
	})
	p.addr = net.JoinHostPort(ip, "8080")
	return &nsProc{proc: p.proc, ns: ns, ip: ip, args: args}
}

type startedProc struct {
	*proc
	listening chan struct{}
}

// startIn starts the binary in ns; listening is closed at the node's
// "node listening" log line.
func startIn(ns, id string, args []string) (*startedProc, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, binPath}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "SERVICE_CLUSTER_SECRET="+meshSecret, "SERVICE_ADMIN_KEY="+adminKey)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &startedProc{proc: &proc{id: id, cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan struct{})}, listening: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			p.stderr.WriteString(line + "\n")
			if listenLine.MatchString(line) {
				once.Do(func() { close(p.listening) })
			}
		}
	}()
	go func() { p.err = cmd.Wait(); pw.Close(); close(p.exited) }()
	return p, nil
}

// templateArgs are the StatefulSet container's args with the pod's
// variables filled in, and its data directory replaced by dataDir.
func templateArgs(t *testing.T, podName, podIP, dataDir string) []string {
	t.Helper()
	var sts appsv1.StatefulSet
	if err := yaml.Unmarshal(readRepo(t, "deploy/kubernetes/statefulset.yaml"), &sts); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
		a = strings.NewReplacer("$(POD_IP)", podIP, "$(POD_NAME)", podName).Replace(a)
		if strings.HasPrefix(a, "--data-dir=") {
			a = "--data-dir=" + dataDir
		}
		out = append(out, a)
	}
	return out
}

// keyedJSON calls a node with the admin key; a non-200 is an error.
func keyedJSON(c *http.Client, p *proc, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, p.url(path), rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s on %s: %d %s", method, path, p.id, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

type raftView struct {
	Leader string `json:"leader"`
	Data   []struct {
		ID       string `json:"id"`
		Address  string `json:"address"`
		Suffrage string `json:"suffrage"`
	} `json:"data"`
}

// oneLeader checks that every node names the same leader among three
// voters whose raft addresses are the namespaces' addresses.
func oneLeader(c *http.Client, ps []*nsProc) (string, error) {
	leader := ""
	for _, p := range ps {
		var v raftView
		if err := keyedJSON(c, p.proc, "GET", "/v1/server/raft/peers", nil, &v); err != nil {
			return "", err
		}
		voters := 0
		for _, s := range v.Data {
			if s.Suffrage == "voter" {
				voters++
			}
			if h, _, _ := net.SplitHostPort(s.Address); net.ParseIP(h).IsLoopback() {
				return "", fmt.Errorf("%s: raft server %s has loopback address %s", p.id, s.ID, s.Address)
			}
		}
		if v.Leader == "" || voters != 3 || leader != "" && v.Leader != leader {
			return "", fmt.Errorf("%s: leader %q, %d voters (others said %q)", p.id, v.Leader, voters, leader)
		}
		leader = v.Leader
	}
	return leader, nil
}

func TestNetnsStatefulSetStart(t *testing.T) {
	const n = 3
	lab := newNetnsLab(t, n)
	client := &http.Client{Timeout: 30 * time.Second}
	// The init container's job: the models the image ships, installed.
	var args [][]string
	for i := range n {
		data := t.TempDir()
		out, err := exec.Command(binPath, "models", "import", "--data-dir", data, onnxtest.AssetDir(t, "tiny-bert", "manifest.json")).CombinedOutput()
		if err != nil {
			t.Fatalf("import: %v\n%s", err, out)
		}
		args = append(args, templateArgs(t, fmt.Sprintf("infermesh-%d", i), lab.ips[i], data))
	}
	t.Logf("template args of infermesh-0: %q", args[0])

	// All three at once, as podManagementPolicy: Parallel starts them.
	start := time.Now()
	ps := make([]*nsProc, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp, err := startIn(lab.ns[i], fmt.Sprintf("infermesh-%d", i), args[i])
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() {
				sp.cmd.Process.Kill()
				<-sp.exited
				if t.Failed() {
					t.Logf("node %s log:\n%s", sp.id, sp.stderr)
				}
			})
			select {
			case <-sp.listening:
			case <-sp.exited:
				t.Errorf("%s exited: %v\n%s", sp.id, sp.err, sp.stderr)
				return
			case <-time.After(60 * time.Second):
				t.Errorf("%s did not listen", sp.id)
				return
			}
			sp.addr = net.JoinHostPort(lab.ips[i], "8080")
			ps[i] = &nsProc{proc: sp.proc, ns: lab.ns[i], ip: lab.ips[i], args: args[i]}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	waitReady(t, procsOf(ps)...)
	var leader string
	eventually(t, 60*time.Second, "one leader, three voters", func() (err error) {
		leader, err = oneLeader(client, ps)
		return err
	})
	t.Logf("ready with one leader (%s) %.1fs after the simultaneous start", leader, time.Since(start).Seconds())
	boots := 0
	for _, p := range ps {
		boots += strings.Count(p.stderr.String(), "bootstrap-expect: bootstrapping raft")
	}
	if boots != 1 {
		t.Fatalf("%d nodes bootstrapped raft", boots)
	}
	// Every node advertises its namespace address, never loopback.
	for _, p := range ps {
		var m struct {
			Data []struct {
				ID       string `json:"id"`
				HTTPAddr string `json:"http_addr"`
				State    string `json:"state"`
			} `json:"data"`
		}
		if err := keyedJSON(client, p.proc, "GET", "/v1/server/members", nil, &m); err != nil {
			t.Fatal(err)
		}
		if len(m.Data) != n {
			t.Fatalf("%s sees %d members", p.id, len(m.Data))
		}
		for _, d := range m.Data {
			k, _ := strconv.Atoi(strings.TrimPrefix(d.ID, "infermesh-"))
			if d.HTTPAddr != net.JoinHostPort(lab.ips[k], "8080") {
				t.Fatalf("%s sees %s at %s, want %s:8080", p.id, d.ID, d.HTTPAddr, lab.ips[k])
			}
		}
	}
	// Key writes through every node (followers forward to the leader).
	for _, p := range ps {
		if err := keyedJSON(client, p.proc, "POST", "/v1/server/keys", map[string]any{"name": "through-" + p.id}, nil); err != nil {
			t.Fatal(err)
		}
	}

	// The rolling restart. The client loop is a load balancer following
	// readiness: it sends each request, without any retry, to the next
	// node in rotation that is not the one being restarted; the
	// restarter takes that node out of the rotation (waiting for requests
	// in flight to it to finish, as a preStop hook's sleep does) before
	// SIGTERM and puts it back only once its /readyz says 200. Nodes still
	// forward to the restarting node (keys to a raft leader, embeddings to
	// any peer) as they see fit: those hops are the mesh's business, and
	// any failure surfaces to the client and counts. Every error counts:
	// a transport error or any status other than 200.
	var mu sync.RWMutex
	down := -1
	var sent, failed atomic.Int64
	var perKind [3]atomic.Int64
	var errMu sync.Mutex
	var errs []string
	stop := make(chan struct{})
	var loop sync.WaitGroup
	loop.Add(1)
	go func() {
		defer loop.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			mu.RLock()
			k := i % n
			if k == down {
				k = (k + 1) % n
			}
			p := ps[k].proc
			var err error
			switch i % 3 {
			case 0:
				err = keyedJSON(client, p, "POST", "/v1/embeddings", map[string]any{"model": "tiny-bert:test-128", "input": fmt.Sprintf("rolling restart %d", i)}, nil)
			case 1:
				err = keyedJSON(client, p, "POST", "/v1/server/keys", map[string]any{"name": fmt.Sprintf("loop-%d", i)}, nil)
			case 2:
				err = keyedJSON(client, p, "GET", "/v1/server/keys", nil, nil)
			}
			mu.RUnlock()
			sent.Add(1)
			perKind[i%3].Add(1)
			if err != nil {
				failed.Add(1)
				errMu.Lock()
				errs = append(errs, err.Error())
				errMu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	restartStart := time.Now()
	for i := range ps {
		mu.Lock()
		down = i
		mu.Unlock()
		t0 := time.Now()
		stopProc(t, ps[i].proc, syscall.SIGTERM)
		if ps[i].err != nil {
			t.Fatalf("%s exited with %v after SIGTERM", ps[i].id, ps[i].err)
		}
		stopped := time.Since(t0)
		ps[i] = launchIn(t, ps[i].ns, ps[i].ip, ps[i].id, ps[i].args)
		waitReady(t, ps[i].proc)
		mu.Lock()
		down = -1
		mu.Unlock()
		t.Logf("%s: stopped in %.1fs, back and ready in %.1fs", ps[i].id, stopped.Seconds(), time.Since(t0).Seconds())
	}
	time.Sleep(time.Second) // a last round through all three
	close(stop)
	loop.Wait()
	if failed.Load() != 0 || sent.Load() < 30 {
		t.Fatalf("rolling restart: %d of %d requests failed; first ones: %q", failed.Load(), sent.Load(), errs[:min(len(errs), 5)])
	}
	t.Logf("rolling restart in %.1fs: %d requests (%d embeddings, %d key writes, %d key lists), none failed",
		time.Since(restartStart).Seconds(), sent.Load(), perKind[0].Load(), perKind[1].Load(), perKind[2].Load())
	eventually(t, 30*time.Second, "one leader after the restarts", func() (err error) {
		leader, err = oneLeader(client, ps)
		return err
	})
	for _, p := range ps {
		if strings.Contains(p.stderr.String(), "bootstrap-expect: bootstrapping raft") {
			t.Fatalf("%s bootstrapped again after its restart", p.id)
		}
	}
	// Every key the loop wrote reaches every node (a follower applies the
	// last entries a heartbeat after the leader acknowledged them).
	written := int(perKind[1].Load()) + n
	eventually(t, 30*time.Second, "every node lists every key written", func() error {
		var want int
		for _, p := range ps {
			var keys struct {
				Data []struct {
					Name string `json:"name"`
				} `json:"data"`
			}
			if err := keyedJSON(client, p.proc, "GET", "/v1/server/keys", nil, &keys); err != nil {
				return err
			}
			if want == 0 {
				want = len(keys.Data)
			}
			if len(keys.Data) != want || want < written {
				return fmt.Errorf("%s lists %d keys, want %d (at least %d written)", p.id, len(keys.Data), want, written)
			}
		}
		return nil
	})
}

func procsOf(ps []*nsProc) []*proc {
	var out []*proc
	for _, p := range ps {
		out = append(out, p.proc)
	}
	return out
}

// Without --advertise, a node listening on 0.0.0.0 in a namespace with one
// address advertises that address to the mesh it joins; with two
// addresses, or only loopback, it refuses to start and names the flag.
func TestNetnsAdvertiseChoice(t *testing.T) {
	lab := newNetnsLab(t, 1)
	id := "infermesh-0"
	args := []string{"serve", "--listen=0.0.0.0:8080", "--node-id=" + id, "--data-dir=" + t.TempDir(), "--join=infermesh-peers:7946"}
	p := launchIn(t, lab.ns[0], lab.ips[0], id, args)
	if !strings.Contains(p.stderr.String(), "rpc="+lab.ips[0]+":7947") {
		t.Fatalf("the node does not advertise %s:7947:\n%s", lab.ips[0], p.stderr)
	}
	eventually(t, 20*time.Second, "gossip bound to the namespace address", func() error {
		if !strings.Contains(p.stderr.String(), "gossip="+lab.ips[0]+":7946") {
			return fmt.Errorf("no mesh member line with gossip=%s:7946", lab.ips[0])
		}
		return nil
	})

	refuse := func(ns, want string) {
		t.Helper()
		sp, err := startIn(ns, "refused", []string{"serve", "--listen=0.0.0.0:8080", "--node-id=refused", "--data-dir=" + t.TempDir(), "--join=10.213.0.1:7946"})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-sp.exited:
		case <-time.After(30 * time.Second):
			sp.cmd.Process.Kill()
			t.Fatalf("a node in %s started:\n%s", ns, sp.stderr)
		}
		var ee *exec.ExitError
		if ok := errors.As(sp.err, &ee); !ok || ee.ExitCode() != 2 || !strings.Contains(sp.stderr.String(), want) {
			t.Fatalf("in %s: exit %v, want 2 and %q in:\n%s", ns, sp.err, want, sp.stderr)
		}
		t.Logf("%s: %s", ns, strings.TrimSpace(lastLine(sp.stderr.String())))
	}
	refuse(lab.addNamespace(t, lab.subnet+".11/24", "192.168.213.11/24"), "set --advertise")
	refuse(lab.addNamespace(t), "only loopback")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
