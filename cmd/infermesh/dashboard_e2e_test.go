package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/infermesh/infermesh/mesh/route"
)

// TestDashboardInChromium opens /dashboard in a real headless Chromium
// against a 2-node mesh of real processes under traffic. The nodes listen
// on 0.0.0.0, so the loopback rule does not apply and the page must ask
// for a key before it reads anything. After a key is entered every
// section must show live numbers, and they must move. A screenshot is
// saved as a test artefact.
func TestDashboardInChromium(t *testing.T) {
	chrome := chromiumPath(t)
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	const base = "127.0.77"
	var ps []*proc
	for i := 1; i <= 2; i++ {
		ip := fmt.Sprintf("%s.%d", base, i)
		args := []string{"--listen", "0.0.0.0:0", "--advertise", ip, "--gossip-listen", ip + ":17946", "--rpc-listen", ip + ":17947",
			"--cluster-secret", meshSecret, "--fast-timers", "--inflight-cap", "8"}
		if i == 2 {
			args = append(args, "--join", base+".1:17946", "--canary", "--canary-percent", "30")
		}
		p := startNodeArgs(t, fmt.Sprintf("dash-%d", i), []string{"tiny-bert"}, args...)
		_, port, _ := net.SplitHostPort(p.addr)
		p.addr = net.JoinHostPort(ip, port)
		ps = append(ps, p)
	}
	eventuallyEvery(t, 40*time.Second, time.Second, "both nodes ready with the admin key", func() error {
		for _, p := range ps {
			var out struct {
				Data []struct{ State string } `json:"data"`
			}
			code, err := getKeyed(p, adminKey, "/v1/server/members", &out)
			if err != nil || code != 200 {
				return fmt.Errorf("%s: members %d %v", p.id, code, err)
			}
			ready := 0
			for _, d := range out.Data {
				if d.State == "ready" {
					ready++
				}
			}
			if ready != 2 {
				return fmt.Errorf("%s sees %d ready", p.id, ready)
			}
		}
		return nil
	})
	// Two applications whose callers land on different sides of the
	// canary split (it hashes the key id), so both workers serve.
	createKeyEventually(t, ps[0], map[string]any{"name": "probe"})
	appKeys := splitKeys(t, ps[0], 30)

	// Traffic through both nodes for the whole test: embeddings (some
	// served by the other node) and a few requests for a model nobody has.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := ps[i/2]
			for n := 0; ctx.Err() == nil; n++ {
				model := "tiny-bert:test-128"
				if n%7 == 6 {
					model = "no-such-model:1"
				}
				postKeyed(ctx, p, appKeys[i%2], "/v1/embeddings", map[string]any{"model": model, "input": fmt.Sprintf("dashboard traffic %d %d", i, n)})
				select {
				case <-ctx.Done():
				case <-time.After(40 * time.Millisecond):
				}
			}
		}()
	}

	b := launchChromium(t, chrome)
	page := b.newPage(t, 1440, 900)
	defer func() {
		// On failure, keep what the page showed.
		if t.Failed() {
			if shot, err := page.screenshot(); err == nil {
				saveArtifact(t, "dashboard-failed.png", shot)
			}
		}
	}()
	page.navigate(t, ps[0].url("/dashboard"))

	// Off loopback, without a key: the page asks for one and fetches nothing.
	page.waitFor(t, 10*time.Second, "the key prompt", `(() => {
		const ask = document.getElementById('ask');
		return !ask.classList.contains('hidden') && ask.textContent.includes('API key') &&
			document.getElementById('updated').textContent === 'waiting for a key';
	})()`)
	if got := page.eval(t, `document.getElementById('node').textContent`); got != "…" {
		t.Fatalf("the page showed data before a key was entered: node %v", got)
	}

	// Enter the key as an operator would: type it and submit.
	page.eval(t, `document.getElementById('key').focus()`)
	page.call(t, "Input.insertText", map[string]any{"text": adminKey}, nil)
	page.eval(t, `document.getElementById('keysave').click()`)
	if v := page.eval(t, `sessionStorage.getItem('infermesh.dashboard.key') === `+jsString(adminKey)+` && localStorage.length === 0 && document.cookie === ''`); v != true {
		t.Fatal("the key is not kept in sessionStorage alone")
	}

	// Every section shows live numbers from both nodes.
	var facts dashFacts
	eventuallyEvery(t, 60*time.Second, time.Second, "every section live", func() error {
		facts = page.facts(t)
		return facts.complete([]string{"dash-1", "dash-2"})
	})
	t.Logf("dashboard: state %s, %s req/s, p50 %s p95 %s p99 %s, leader %s", facts.State, facts.RPS, facts.P50, facts.P95, facts.P99, facts.Leader)

	// It updates: the counters, the timestamp and the charts move.
	before := facts
	eventuallyEvery(t, 30*time.Second, time.Second, "the page updates", func() error {
		now := page.facts(t)
		switch {
		case now.Updated == before.Updated:
			return errors.New("the update time did not change")
		case now.Total == before.Total:
			return fmt.Errorf("requests served still %s", now.Total)
		case now.NodeChart == before.NodeChart:
			return errors.New("the node chart did not change")
		case now.MeshChart == before.MeshChart:
			return errors.New("the mesh chart did not change")
		}
		facts = now
		return nil
	})

	shot, err := page.screenshot()
	if err != nil {
		t.Fatal(err)
	}
	path := saveArtifact(t, "dashboard.png", shot)
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() < 1000 || img.Bounds().Dy() < 900 {
		t.Fatalf("screenshot: %v %v", err, img.Bounds())
	}
	t.Logf("dashboard screenshot: %s (%dx%d)", path, img.Bounds().Dx(), img.Bounds().Dy())

	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Fatalf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// dashFacts is what the page shows, read from its DOM.
type dashFacts struct {
	Node, State, Version, Leader, Updated string
	RPS, P50, P95, P99, Total, InFlight   string
	NodeChart, MeshChart                  string
	MeshReady, MeshRPS, MeshRaft          string
	MeshCanary, MeshModels                string
	MeshLines                             int
	Endpoints                             []string
	Workers                               []workerFacts
	Models                                []string
	UsageApp, UsageWorker, UsageModel     []string
	RaftServers                           []string
	RaftLeaderBadges                      int
	SectionsEmpty                         []string
}

type workerFacts struct {
	ID, State, Reason, Meter, Latency, Models string
	Canary                                    bool
}

const factsJS = `(() => {
	const q = s => document.querySelector(s), txt = s => (q(s) || {}).textContent || '';
	const rows = id => [...document.querySelectorAll('#' + id + ' tbody tr')].filter(r => !r.querySelector('.empty')).map(r => r.textContent.trim());
	return {
		Node: txt('#node'), State: txt('#state'), Version: txt('#version'), Leader: txt('#hdr-leader'), Updated: txt('#updated'),
		MeshReady: txt('#m-ready'), MeshRPS: txt('#m-rps'), MeshRaft: txt('#m-raft'), MeshCanary: txt('#m-canary'), MeshModels: txt('#m-models'),
		RPS: txt('#t-rps'), P50: txt('#t-p50'), P95: txt('#t-p95'), P99: txt('#t-p99'), Total: txt('#t-total'), InFlight: txt('#t-inflight'),
		NodeChart: [...document.querySelectorAll('#chart-node polyline')].map(p => p.getAttribute('points')).join('|'),
		MeshChart: [...document.querySelectorAll('#chart-mesh polyline')].map(p => p.getAttribute('points')).join('|'),
		MeshLines: document.querySelectorAll('#chart-mesh polyline').length,
		Endpoints: rows('endpoints'), Models: rows('models'),
		UsageApp: rows('usage-app'), UsageWorker: rows('usage-worker'), UsageModel: rows('usage-model'),
		RaftServers: rows('raft'), RaftLeaderBadges: document.querySelectorAll('#raft .b-leader').length,
		Workers: [...document.querySelectorAll('#workers tbody tr')].filter(r => r.cells.length > 1).map(r => ({
			ID: r.cells[0].querySelector('b').textContent, State: r.cells[1].textContent, Reason: r.cells[2].textContent,
			Meter: r.cells[3].textContent, Latency: r.cells[6].textContent, Models: r.cells[7].textContent,
			Canary: !!r.cells[0].querySelector('.b-canary')})),
		SectionsEmpty: [...document.querySelectorAll('section[data-section]')].filter(s => s.textContent.trim() === '').map(s => s.dataset.section),
	};
})()`

// complete says what is still missing for the page to count as showing
// every section with live numbers from the given workers.
func (f dashFacts) complete(workers []string) error {
	num := regexp.MustCompile(`^[0-9][0-9.,]*( ms| s)?$`)
	nonzero := func(s string) bool { return num.MatchString(s) && strings.Trim(s, "0., ms") != "" }
	switch {
	case f.Node != "dash-1" || f.State != "ready" || f.Version == "" || f.Version == "…":
		return fmt.Errorf("header: node %q state %q version %q", f.Node, f.State, f.Version)
	case !strings.HasPrefix(f.Updated, "updated "):
		return fmt.Errorf("not live: %q", f.Updated)
	case !nonzero(f.RPS) || !nonzero(f.Total):
		return fmt.Errorf("no request rate yet: %q req/s, %q total", f.RPS, f.Total)
	case !nonzero(f.P50) || !nonzero(f.P95) || !nonzero(f.P99):
		return fmt.Errorf("latency %q %q %q", f.P50, f.P95, f.P99)
	case !strings.HasSuffix(f.InFlight, "/ 8"):
		return fmt.Errorf("in flight against cap: %q", f.InFlight)
	case f.MeshReady != fmt.Sprintf("%d / %d", len(workers), len(workers)) || !nonzero(f.MeshRPS) || f.MeshRaft != "leader dash-1" ||
		f.MeshCanary != "1" || f.MeshModels != fmt.Sprintf("%d / %d", len(workers), len(workers)):
		return fmt.Errorf("mesh tiles: ready %q, %q model req/s, raft %q, canaries %q, models %q", f.MeshReady, f.MeshRPS, f.MeshRaft, f.MeshCanary, f.MeshModels)
	case strings.Count(f.NodeChart, ",") < 6:
		return fmt.Errorf("node chart has no series: %q", f.NodeChart)
	case f.MeshLines < len(workers) || strings.Count(f.MeshChart, ",") < 2*len(workers):
		return fmt.Errorf("mesh chart: %d lines", f.MeshLines)
	case len(f.Endpoints) == 0 || !strings.Contains(strings.Join(f.Endpoints, "\n"), "/v1/embeddings"):
		return fmt.Errorf("top endpoints: %q", f.Endpoints)
	case len(f.Workers) != len(workers):
		return fmt.Errorf("workers: %+v", f.Workers)
	case len(f.Models) != 1 || strings.Count(f.Models[0], "warm") != len(workers):
		return fmt.Errorf("mesh models: %q", f.Models)
	case len(f.UsageApp) == 0 || !strings.Contains(strings.Join(f.UsageApp, "\n"), "shop"):
		return fmt.Errorf("usage by app: %q", f.UsageApp)
	case len(f.UsageWorker) < len(workers) || len(f.UsageModel) == 0:
		return fmt.Errorf("usage by worker %q, by model %q", f.UsageWorker, f.UsageModel)
	case len(f.RaftServers) != len(workers) || f.RaftLeaderBadges != 1 || f.Leader == "none" || f.Leader == "":
		return fmt.Errorf("raft: leader %q servers %q", f.Leader, f.RaftServers)
	case len(f.SectionsEmpty) > 0:
		return fmt.Errorf("empty sections %q", f.SectionsEmpty)
	}
	canaries := 0
	for i, w := range f.Workers {
		if w.ID != workers[i] || w.State != "ready" || !strings.HasPrefix(w.Reason, "serving") {
			return fmt.Errorf("worker %+v", w)
		}
		if !strings.HasSuffix(w.Meter, "/ 8") || !strings.HasPrefix(w.Models, "1 / 1") {
			return fmt.Errorf("worker %s: in flight %q, models %q", w.ID, w.Meter, w.Models)
		}
		if !strings.Contains(w.Latency, " ms") && !strings.Contains(w.Latency, " s") {
			return fmt.Errorf("worker %s has no latency yet: %q", w.ID, w.Latency)
		}
		if w.Canary {
			canaries++
		}
	}
	if canaries != 1 || !f.Workers[1].Canary {
		return fmt.Errorf("canary badges: %+v", f.Workers)
	}
	return nil
}

// splitKeys returns the plaintexts of a key of app "shop" whose caller is
// on the stable side of a canary split of percent and of a key of app
// "search" on the canary side (the split hashes the key id).
func splitKeys(t *testing.T, p *proc, percent int) [2]string {
	t.Helper()
	var out [2]string
	for side, app := range []string{"shop", "search"} {
		for try := 0; out[side] == ""; try++ {
			if try == 60 {
				t.Fatalf("no %s key on side %d of the canary split in 60 tries", app, side)
			}
			k := createAppKey(t, p, fmt.Sprintf("%s frontend %d", app, try), app)
			if canary := route.CanaryBucket("key:"+k.ID) < percent; canary == (side == 1) {
				out[side] = k.Key
			}
		}
	}
	return out
}

// createAppKey makes a key of an app through the admin API.
func createAppKey(t *testing.T, p *proc, name, app string) keyView {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"name": name, "app": app})
	req, _ := http.NewRequest("POST", p.url("/v1/server/keys"), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var k keyView
	if err := json.NewDecoder(resp.Body).Decode(&k); err != nil || resp.StatusCode != 200 || k.ID == "" {
		t.Fatalf("create key: %d %v", resp.StatusCode, err)
	}
	return k
}

func jsString(s string) string { b, _ := json.Marshal(s); return string(b) }

// getKeyed GETs path with a key and decodes the JSON answer into out.
func getKeyed(p *proc, key, path string, out any) (int, error) {
	req, _ := http.NewRequest("GET", p.url(path), nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
}

// postKeyed POSTs a JSON body with a key and drops the answer.
func postKeyed(ctx context.Context, p *proc, key, path string, body any) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", p.url(path), bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// chromiumPath finds the Chromium binary; a missing one fails the test
// (install the Debian packages chromium and chromium-driver).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found on PATH: install the Debian packages chromium and chromium-driver")
	return ""
}

// A minimal Chrome DevTools protocol client: one browser WebSocket, pages
// attached as flattened sessions, JSON commands and events.

// browser is a running headless Chromium and its DevTools connection.
type browser struct {
	conn    *websocket.Conn
	mu      sync.Mutex
	next    int64
	pending map[int64]chan cdpMessage
	console []string
}

type cdpMessage struct {
	ID        int64           `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

var devtoolsLine = regexp.MustCompile(`DevTools listening on (ws://\S+)`)

// launchChromium starts headless Chromium with a fresh profile and no
// network of its own, and connects to its DevTools endpoint.
func launchChromium(t *testing.T, path string) *browser {
	t.Helper()
	cmd := exec.Command(path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--no-proxy-server", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	var logMu sync.Mutex
	var log bytes.Buffer
	wsURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logMu.Lock()
			log.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := devtoolsLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case wsURL <- m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the browser's own process group
		cmd.Wait()
		if t.Failed() {
			logMu.Lock()
			t.Logf("chromium log:\n%s", log.String())
			logMu.Unlock()
		}
	})
	var u string
	select {
	case u = <-wsURL:
	case <-time.After(30 * time.Second):
		t.Fatal("chromium did not print its DevTools address")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatalf("connect to chromium: %v", err)
	}
	conn.SetReadLimit(256 << 20) // full-page screenshots
	b := &browser{conn: conn, pending: map[int64]chan cdpMessage{}}
	go b.read()
	t.Cleanup(func() { conn.CloseNow() })
	return b
}

func (b *browser) read() {
	for {
		_, data, err := b.conn.Read(context.Background())
		if err != nil {
			b.mu.Lock()
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m cdpMessage
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		if m.ID != 0 {
			b.mu.Lock()
			ch := b.pending[m.ID]
			delete(b.pending, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m
			}
			continue
		}
		b.event(m)
	}
}

// event records what the page reports as an error: console.error calls,
// uncaught exceptions and browser log errors (failed loads, CSP
// violations).
func (b *browser) event(m cdpMessage) {
	var line string
	switch m.Method {
	case "Runtime.consoleAPICalled":
		var p struct {
			Type string `json:"type"`
			Args []struct {
				Value       any    `json:"value"`
				Description string `json:"description"`
			} `json:"args"`
		}
		json.Unmarshal(m.Params, &p)
		if p.Type == "error" || p.Type == "assert" {
			line = "console." + p.Type + ":"
			for _, a := range p.Args {
				line += fmt.Sprintf(" %v%s", a.Value, a.Description)
			}
		}
	case "Runtime.exceptionThrown":
		var p struct {
			Details struct {
				Text      string `json:"text"`
				Exception struct {
					Description string `json:"description"`
				} `json:"exception"`
			} `json:"exceptionDetails"`
		}
		json.Unmarshal(m.Params, &p)
		line = "exception: " + p.Details.Text + " " + p.Details.Exception.Description
	case "Log.entryAdded":
		var p struct {
			Entry struct {
				Level, Source, Text, URL string
			} `json:"entry"`
		}
		json.Unmarshal(m.Params, &p)
		if p.Entry.Level == "error" {
			line = fmt.Sprintf("log %s: %s %s", p.Entry.Source, p.Entry.Text, p.Entry.URL)
		}
	}
	if line != "" {
		b.mu.Lock()
		b.console = append(b.console, line)
		b.mu.Unlock()
	}
}

func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.console...)
}

// call sends one command (to a page session when session is not empty)
// and decodes its result into out.
func (b *browser) call(t *testing.T, session, method string, params, out any) {
	t.Helper()
	if err := b.callErr(session, method, params, out); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
}

func (b *browser) callErr(session, method string, params, out any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	ch := make(chan cdpMessage, 1)
	b.mu.Lock()
	b.next++
	id := b.next
	b.pending[id] = ch
	b.mu.Unlock()
	msg, _ := json.Marshal(cdpMessage{ID: id, Method: method, Params: raw, SessionID: session})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return errors.New("the DevTools connection closed")
		}
		if m.Error != nil {
			return fmt.Errorf("%d %s", m.Error.Code, m.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// page is one tab, attached as a flattened session.
type page struct {
	b       *browser
	session string
}

// newPage opens a tab of the given viewport and enables the domains
// whose events report errors.
func (b *browser) newPage(t *testing.T, width, height int) *page {
	t.Helper()
	var target struct {
		TargetID string `json:"targetId"`
	}
	b.call(t, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	b.call(t, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	p := &page{b: b, session: att.SessionID}
	for _, d := range []string{"Runtime.enable", "Log.enable", "Page.enable"} {
		p.call(t, d, map[string]any{}, nil)
	}
	p.call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
	return p
}

func (p *page) call(t *testing.T, method string, params, out any) {
	t.Helper()
	p.b.call(t, p.session, method, params, out)
}

// navigate loads url and waits for the document to finish loading.
func (p *page) navigate(t *testing.T, url string) {
	t.Helper()
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	p.call(t, "Page.navigate", map[string]any{"url": url}, &nav)
	if nav.ErrorText != "" {
		t.Fatalf("navigate to %s: %s", url, nav.ErrorText)
	}
	p.waitFor(t, 15*time.Second, "the page to load", `document.readyState === 'complete' && location.href === `+jsString(url))
}

// eval runs a JavaScript expression in the page and returns its value.
func (p *page) eval(t *testing.T, expr string) any {
	t.Helper()
	var res struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	p.call(t, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if res.Exception != nil {
		t.Fatalf("evaluate %s: %s", expr, res.Exception.Text)
	}
	return res.Result.Value
}

// waitFor polls a JavaScript condition until it is true.
func (p *page) waitFor(t *testing.T, bound time.Duration, what, cond string) {
	t.Helper()
	eventuallyEvery(t, bound, 100*time.Millisecond, what, func() error {
		if p.eval(t, cond) == true {
			return nil
		}
		return errors.New("not yet")
	})
}

// facts reads what the dashboard shows.
func (p *page) facts(t *testing.T) dashFacts {
	t.Helper()
	raw, _ := json.Marshal(p.eval(t, factsJS))
	var f dashFacts
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// screenshot captures the whole page as PNG.
func (p *page) screenshot() ([]byte, error) {
	var shot struct {
		Data string `json:"data"`
	}
	var metrics struct {
		Size struct {
			Width  float64 `json:"width"`
			Height float64 `json:"height"`
		} `json:"cssContentSize"`
	}
	if err := p.b.callErr(p.session, "Page.getLayoutMetrics", map[string]any{}, &metrics); err != nil {
		return nil, err
	}
	clip := map[string]any{"x": 0, "y": 0, "width": metrics.Size.Width, "height": metrics.Size.Height, "scale": 1}
	if err := p.b.callErr(p.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true, "clip": clip}, &shot); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(shot.Data)
}

// saveArtifact writes a test artefact to $INFERMESH_ARTIFACTS (default:
// infermesh-artifacts in the system's temporary directory), logs its path
// and returns it.
func saveArtifact(t *testing.T, name string, data []byte) string {
	dir := os.Getenv("INFERMESH_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "infermesh-artifacts")
	}
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("artefact %s: %v", name, err)
		return path
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Errorf("artefact %s: %v", name, err)
	}
	t.Logf("artefact: %s", path)
	return path
}
