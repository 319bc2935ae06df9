package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus/rpcmux/tlstest"
)

// peerFiles is one node's peer certificate, key and CA files.
type peerFiles struct{ cert, key, ca string }

func newPeerFiles(t *testing.T, leaf *tlstest.Leaf, cas ...*tlstest.CA) peerFiles {
	t.Helper()
	dir := t.TempDir()
	f := peerFiles{filepath.Join(dir, "peer.crt"), filepath.Join(dir, "peer.key"), filepath.Join(dir, "peer-ca.crt")}
	leaf.WriteFiles(t, f.cert, f.key)
	f.trust(t, cas...)
	return f
}

// trust writes a CA bundle.
func (f peerFiles) trust(t *testing.T, cas ...*tlstest.CA) {
	t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, ca.PEM...)
	}
	tmp := f.ca + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.ca); err != nil {
		t.Fatal(err)
	}
}

func (f peerFiles) args() []string {
	return []string{"--peer-cert", f.cert, "--peer-key", f.key, "--peer-ca", f.ca}
}

func startPeerTLSNode(t *testing.T, id, ip, join string, models []string, f peerFiles) *proc {
	t.Helper()
	args := []string{"--listen", ip + ":0", "--gossip-listen", ip + ":17946", "--rpc-listen", ip + ":17947",
		"--cluster-secret", meshSecret, "--fast-timers", "--drain-timeout", "60s"}
	if join != "" {
		args = append(args, "--join", join)
	}
	return startNodeArgs(t, id, models, append(args, f.args()...)...)
}

// metricValue reads one counter from a node's /v1/server/metrics.
func metricValue(p *proc, name string) (float64, error) {
	resp, err := http.Get(p.url("/v1/server/metrics"))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s: no metric %s", p.id, name)
}

// createKeyOn writes a key through p (a loopback node needs no admin key)
// and returns the status.
func createKeyOn(p *proc, name string) (int, error) {
	body, _ := json.Marshal(map[string]any{"name": name})
	resp, err := http.Post(p.url("/v1/server/keys"), "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func signalAll(t *testing.T, ps []*proc) {
	t.Helper()
	for _, p := range ps {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	// SIGHUP is handled at once; leave room for a loaded machine.
	time.Sleep(time.Second)
}

// Three processes under mutual TLS on the RPC port form a mesh, forward
// requests and replicate writes; the certificates and then the CA are
// rotated by replacing the files and SIGHUP, without a restart; a node
// with the new CA joins and works; nodes with a retired CA's certificate
// or an expired one get nothing through, although they hold the cluster
// secret.
func TestEndToEndPeerMTLS(t *testing.T) {
	ca1 := tlstest.NewCA(t, "mesh-ca-1")
	type member struct {
		id, ip string
		models []string
	}
	nodes := []member{{"mtls-a", "127.0.41.1", []string{"tiny-bert"}}, {"mtls-b", "127.0.41.2", nil}, {"mtls-c", "127.0.41.3", nil}}
	join := nodes[0].ip + ":17946"
	var ps []*proc
	var files []peerFiles
	for i, m := range nodes {
		f := newPeerFiles(t, ca1.Valid(t, m.ip), ca1)
		j := join
		if i == 0 {
			j = ""
		}
		ps = append(ps, startPeerTLSNode(t, m.id, m.ip, j, m.models, f))
		files = append(files, f)
	}
	waitMembers(t, ps, 3)
	ctx := context.Background()
	check := func(via *proc, what string) {
		t.Helper()
		eventually(t, 30*time.Second, what+" through "+via.id, func() error {
			backend, err := embedVia(ctx, via, "mutual tls")
			if err == nil && backend != "mtls-a" {
				err = fmt.Errorf("served by %s, want mtls-a", backend)
			}
			if err != nil {
				return err
			}
			code, err := createKeyOn(via, what+"-"+via.id)
			if err == nil && code != 200 {
				err = fmt.Errorf("create key: %d", code)
			}
			return err
		})
	}
	for _, p := range ps[1:] {
		check(p, "forward and write")
	}

	// Rotation to a new CA without a restart: trust both, switch the
	// certificates, retire the old CA.
	ca2 := tlstest.NewCA(t, "mesh-ca-2")
	for _, f := range files {
		f.trust(t, ca1, ca2)
	}
	signalAll(t, ps)
	for i, f := range files {
		ca2.Valid(t, nodes[i].ip).WriteFiles(t, f.cert, f.key)
	}
	signalAll(t, ps)
	for _, f := range files {
		f.trust(t, ca2)
	}
	signalAll(t, ps)
	for _, p := range ps[1:] {
		check(p, "after rotation")
	}

	// A newcomer with the new CA only: every connection it makes or takes
	// is new, so it proves the members present and accept the new ones.
	d := startPeerTLSNode(t, "mtls-d", "127.0.41.4", join, nil, newPeerFiles(t, ca2.Valid(t, "127.0.41.4"), ca2))
	ps = append(ps, d)
	waitMembers(t, ps, 4)
	check(d, "newcomer")

	// Outsiders with the secret but a retired CA's or an expired
	// certificate: nothing they send over the RPC port is accepted.
	before, err := metricValue(ps[0], "infermesh_rpc_tls_refused_total")
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range []struct {
		id   string
		leaf *tlstest.Leaf
	}{{"mtls-old-ca", ca1.Valid(t, "127.0.41.5")}, {"mtls-expired", ca2.Expired(t, "127.0.41.6")}} {
		ip := fmt.Sprintf("127.0.41.%d", 5+i)
		p := startPeerTLSNode(t, o.id, ip, join, nil, newPeerFiles(t, o.leaf, ca1, ca2))
		eventually(t, 30*time.Second, o.id+" to see the model in gossip", func() error {
			m, err := members(p)
			if err == nil && m["mtls-a"] != "ready" {
				err = fmt.Errorf("members %v", m)
			}
			return err
		})
		for range 3 {
			if backend, err := embedVia(ctx, p, "intruder"); err == nil {
				t.Fatalf("%s got a forwarded answer from %s", o.id, backend)
			}
		}
		if code, err := createKeyOn(p, "intruder-key"); err == nil && code == 200 {
			t.Fatalf("%s wrote a key", o.id)
		}
	}
	after, err := metricValue(ps[0], "infermesh_rpc_tls_refused_total")
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("mtls-a refused %v TLS connections before the outsiders and %v after", before, after)
	}
	// The members are unaffected.
	check(ps[2], "after the outsiders")
}
