package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// These tests need the limits wiring of node/admission.go (flags --rpm,
// --client-rpm, --busy-capacity, --busy-queue; the plan and first-party
// apps in the pool policy; X-Service-Upgrade on Free plan refusals).

const limitsModel = "tiny-bert:test-128"

// limitsCall posts an embeddings request with an optional key,
// User-Agent and priority; it returns the status, the error code and the
// response headers.
func limitsCall(p *proc, key, userAgent, priority string) (int, string, http.Header, error) {
	body := strings.NewReader(`{"model":"` + limitsModel + `","input":"a limit test"}`)
	req, _ := http.NewRequest("POST", p.url("/v1/embeddings"), body)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if userAgent != "" {
		req.Header.Set("User-Agent", userAgent)
	}
	if priority != "" {
		req.Header.Set("X-Service-Priority", priority)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code, resp.Header, nil
}

// expectLimit checks a refusal: status, code, a Retry-After of at least 1
// s and, when upgrade is set, X-Service-Upgrade: 1 (else none).
func expectLimit(t *testing.T, what string, status int, code string, h http.Header, err error, wantStatus int, wantCode string, upgrade bool) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if status != wantStatus || code != wantCode {
		t.Fatalf("%s: %d %s, want %d %s", what, status, code, wantStatus, wantCode)
	}
	if wantStatus == 429 || wantStatus == 503 {
		if s, _ := strconv.Atoi(h.Get("Retry-After")); s < 1 {
			t.Fatalf("%s: Retry-After %q", what, h.Get("Retry-After"))
		}
	}
	if got := h.Get("X-Service-Upgrade") == "1"; got != upgrade {
		t.Fatalf("%s: X-Service-Upgrade %q, want it %v", what, h.Get("X-Service-Upgrade"), upgrade)
	}
}

// metricSum adds every sample of a metric family whose labels contain
// all of match (each a `name="value"` pair).
func metricSum(p *proc, name string, match ...string) (float64, error) {
	return metricSumKeyed(p, "", name, match...)
}

// metricSumKeyed is metricSum with an API key ("" for none).
func metricSumKeyed(p *proc, key, name string, match ...string) (float64, error) {
	req, _ := http.NewRequest("GET", p.url("/v1/server/metrics"), nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
line:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(l, m) {
				continue line
			}
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			return 0, err
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("%s: no metric %s %v", p.id, name, match)
	}
	return sum, nil
}

// TestBackgroundShedBeforeInteractive: a node with a busy capacity of 4,
// 2 of them reserved for interactive work, and a queue of 4, saturated by
// embeddings from the official SDK: interactive work (at most as many
// callers as reserved slots plus queue, so background work holding the
// other slots cannot crowd it out) always gets through, background work
// (X-Service-Priority: background) is shed with 503 + Retry-After. Prints
// both success rates.
func TestBackgroundShedBeforeInteractive(t *testing.T) {
	p := startLimitsNode(t, "busy", "--busy-capacity", "4", "--busy-reserve", "2", "--busy-queue", "4")
	inputs := make([]string, 64)
	for i := range inputs {
		inputs[i] = strings.Repeat(fmt.Sprintf("sentence %d about the weather and the sea. ", i), 8)
	}
	type tally struct{ ok, busy, other int }
	var (
		mu    sync.Mutex
		stats = map[string]*tally{"interactive": {}, "background": {}}
		wg    sync.WaitGroup
	)
	deadline := time.Now().Add(4 * time.Second)
	worker := func(prio string) {
		defer wg.Done()
		c := p.client()
		var opts []option.RequestOption
		if prio == "background" {
			opts = append(opts, option.WithHeader("X-Service-Priority", "background"))
		}
		for time.Now().Before(deadline) {
			_, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
				Model: limitsModel,
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs},
			}, opts...)
			mu.Lock()
			var apiErr *openai.Error
			switch {
			case err == nil:
				stats[prio].ok++
			case errors.As(err, &apiErr) && apiErr.StatusCode == 503 && apiErr.Response.Header.Get("Retry-After") != "":
				stats[prio].busy++
				if prio == "interactive" {
					t.Logf("interactive refused: %s", apiErr.Code)
				}
			default:
				stats[prio].other++
				t.Errorf("%s request: %v", prio, err)
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go worker("interactive")
	}
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go worker("background")
	}
	wg.Wait()
	rate := func(s *tally) float64 { return float64(s.ok) / float64(max(1, s.ok+s.busy+s.other)) }
	in, bg := stats["interactive"], stats["background"]
	fmt.Printf("saturation (capacity 4, reserve 2, queue 4): interactive %d/%d ok (%.0f%%), background %d/%d ok (%.0f%%)\n",
		in.ok, in.ok+in.busy, 100*rate(in), bg.ok, bg.ok+bg.busy, 100*rate(bg))
	if in.busy != 0 {
		t.Errorf("%d interactive requests were refused", in.busy)
	}
	if bg.busy == 0 || rate(bg) >= rate(in) {
		t.Errorf("background work was not shed first (background %.2f, interactive %.2f)", rate(bg), rate(in))
	}
	shed, err := metricSum(p, "infermesh_gate_shed_total", `priority="background"`)
	if err != nil || int(shed) != bg.busy {
		t.Errorf("shed{background} metric %v (%v), want %d", shed, err, bg.busy)
	}
	if v, err := metricSum(p, "infermesh_gate_admitted_total", `priority="interactive"`); err != nil || int(v) < in.ok {
		t.Errorf("admitted{interactive} metric %v (%v), want at least %d", v, err, in.ok)
	}
}

// startLimitsNode starts a loopback node holding tiny-bert with extra
// serve flags.
func startLimitsNode(t *testing.T, id string, extra ...string) *proc {
	t.Helper()
	args := []string{"--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0", "--drain-timeout", "60s"}
	return startNodeArgs(t, id, []string{"tiny-bert"}, append(args, extra...)...)
}

// TestFreeAllowanceAndUpgrade: on the Free plan (set in the replicated
// policy), third-party callers (keys of apps not marked first-party, and
// keyless tools on loopback named by User-Agent) get 1 request a minute
// per client and 10 a day in all, refused 429 with X-Service-Upgrade: 1;
// first-party keys, admin keys and the operator's own programs are never
// refused; back on Pro the allowance is gone.
func TestFreeAllowanceAndUpgrade(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	p := startLimitsNode(t, "free")
	if code, param, err := adminReq(p, "PUT", "/v1/server/policy", map[string]any{"plan": "free", "first_party_apps": []string{"our-app"}}, nil); err != nil || code != 200 {
		t.Fatalf("policy set plan free: %d %s %v", code, param, err)
	}
	ours := createKey(t, p, map[string]any{"name": "ours", "app": "our-app"})
	var theirs []string
	for i := 0; i < 11; i++ {
		theirs = append(theirs, createKey(t, p, map[string]any{"name": fmt.Sprintf("tool-%d", i), "app": "their-tool"}))
	}
	// One client, one request a minute.
	status, code, h, err := limitsCall(p, theirs[0], "", "")
	expectLimit(t, "third-party key, first", status, code, h, err, 200, "", false)
	status, code, h, err = limitsCall(p, theirs[0], "", "")
	expectLimit(t, "third-party key, second in a minute", status, code, h, err, 429, "free_plan_rate_limit_exceeded", true)
	// The keyless tool is another client: its first request counts too.
	status, code, h, err = limitsCall(p, "", "aider/0.82.1", "")
	expectLimit(t, "keyless tool", status, code, h, err, 200, "", false)
	// 2 used; 8 more clients use the rest of the day.
	for i := 1; i <= 8; i++ {
		status, code, h, err = limitsCall(p, theirs[i], "", "")
		expectLimit(t, fmt.Sprintf("third-party key %d", i), status, code, h, err, 200, "", false)
	}
	for _, key := range theirs[9:] {
		status, code, h, err = limitsCall(p, key, "", "")
		expectLimit(t, "third-party key after 10 today", status, code, h, err, 429, "free_plan_daily_limit_exceeded", true)
		if s, _ := strconv.Atoi(h.Get("Retry-After")); s > 24*3600 {
			t.Fatalf("Retry-After %d s: beyond midnight UTC", s)
		}
	}
	status, code, h, err = limitsCall(p, "", "Open-WebUI/0.6.5", "")
	expectLimit(t, "keyless tool after 10 today", status, code, h, err, 429, "free_plan_daily_limit_exceeded", true)
	// First-party callers are exempt, again and again.
	for i := 0; i < 3; i++ {
		for what, c := range map[string][2]string{
			"first-party key": {ours, ""}, "admin key": {adminKey, ""},
			"operator's SDK program": {"", "OpenAI/Go 3.0"}, "operator's curl": {"", "curl/8.5.0"},
		} {
			status, code, h, err = limitsCall(p, c[0], c[1], "")
			expectLimit(t, what, status, code, h, err, 200, "", false)
		}
	}
	// The official SDK sees the 429 as an error with the headers.
	c := openai.NewClient(option.WithBaseURL(p.url("/v1/")), option.WithAPIKey(theirs[10]), option.WithMaxRetries(0))
	_, err = c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: limitsModel, Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Response.Header.Get("X-Service-Upgrade") != "1" {
		t.Fatalf("SDK call over the allowance: %v", err)
	}
	fmt.Printf("free allowance: 10 third-party requests admitted, then 429 %s with X-Service-Upgrade: 1\n", apiErr.Code)
	// Pro lifts it at once.
	if code, param, err := adminReq(p, "PUT", "/v1/server/policy", map[string]any{"plan": "pro"}, nil); err != nil || code != 200 {
		t.Fatalf("policy set plan pro: %d %s %v", code, param, err)
	}
	status, code, h, err = limitsCall(p, theirs[10], "", "")
	expectLimit(t, "third-party key on Pro", status, code, h, err, 200, "", false)
}

// TestKeyAndClientRPM: --rpm limits each key without its own rpm,
// --client-rpm each client address; refusals are 429 with Retry-After
// and no X-Service-Upgrade; the local operator is never limited.
func TestKeyAndClientRPM(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	p := startLimitsNode(t, "rpm", "--rpm", "2", "--client-rpm", "3")
	a := createKey(t, p, map[string]any{"name": "a", "app": "a"})
	b := createKey(t, p, map[string]any{"name": "b", "app": "b"})
	for i := 0; i < 2; i++ {
		status, code, h, err := limitsCall(p, a, "", "")
		expectLimit(t, fmt.Sprintf("key a request %d", i+1), status, code, h, err, 200, "", false)
	}
	status, code, h, err := limitsCall(p, a, "", "")
	expectLimit(t, "key a over --rpm", status, code, h, err, 429, "rate_limit_exceeded", false)
	// The address has used 2 of its 3 (the refusal gave its token back).
	status, code, h, err = limitsCall(p, b, "", "")
	expectLimit(t, "key b, the address's third", status, code, h, err, 200, "", false)
	status, code, h, err = limitsCall(p, b, "", "")
	expectLimit(t, "key b over --client-rpm", status, code, h, err, 429, "client_rate_limit_exceeded", false)
	for i := 0; i < 5; i++ {
		status, code, h, err = limitsCall(p, "", "", "")
		expectLimit(t, "local operator", status, code, h, err, 200, "", false)
	}
}
