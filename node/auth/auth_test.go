package auth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/prometheus/client_golang/prometheus"
)

type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var t0 = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

// keyKinds are the columns of the tables below, in order.
var keyKinds = []string{"none", "wrong", "expired", "revoked", "plain", "admin", "vision", "pullkey", "adminchat"}

type fixture struct {
	keys  *StaticKeys
	plain map[string]string // kind -> plaintext
}

func newFixture() fixture {
	f := fixture{keys: NewStaticKeys(), plain: map[string]string{}}
	add := func(kind string, k Key) {
		p, h := NewKey()
		k.ID, k.Name, k.Hash = "key_"+kind, kind, h
		f.keys.Put(k)
		f.plain[kind] = p
	}
	add("expired", Key{App: "a", ExpiresAt: t0.Add(-time.Second)})
	add("revoked", Key{App: "a", Revoked: true})
	add("plain", Key{App: "a", ExpiresAt: t0.Add(time.Hour)})
	add("admin", Key{App: "ops", Admin: true})
	add("vision", Key{App: "cam", Endpoints: []string{"vision"}})
	add("pullkey", Key{App: "sync", Endpoints: []string{"models", "pull"}})
	add("adminchat", Key{App: "ops", Admin: true, Endpoints: []string{"chat"}})
	f.plain["wrong"], _ = NewKey()
	return f
}

// endpoints are the rows: one request per class (several for some).
var endpoints = []struct{ method, path string }{
	{"POST", "/v1/chat/completions"},
	{"POST", "/v1/embeddings"},
	{"POST", "/v1/batch/embeddings"},
	{"GET", "/v1/batch/embeddings/job_1"},
	{"POST", "/v1/images/generations"},
	{"POST", "/v1/audio/transcriptions"},
	{"POST", "/v1/vision/detections"},
	{"GET", "/v1/models"},
	{"GET", "/v1/models/catalog"},
	{"POST", "/v1/models/pull"},
	{"GET", "/v1/server/usage"},
	{"POST", "/v1/server/keys"},
	{"PUT", "/v1/server/policy"},
	{"POST", "/v1/models/catalog/refresh"},
	{"GET", "/v1/server/metrics"},
	{"GET", "/dashboard/data"},
	{"GET", "/readyz"},
	{"GET", "/dashboard"},
	{"GET", "/v1/nonexistent"},
}

// Expected results per endpoint, one word per key kind: ok, 401, 403, 429.
// Remote caller (or a node that is not loopback-only).
var remoteTable = []string{
	/* chat          */ "401 401 401 401 ok ok 403 403 ok",
	/* embeddings    */ "401 401 401 401 ok ok 403 403 403",
	/* batch submit  */ "401 401 401 401 ok ok 403 403 403",
	/* batch poll    */ "401 401 401 401 ok ok 403 403 403",
	/* images        */ "401 401 401 401 ok ok 403 403 403",
	/* audio         */ "401 401 401 401 ok ok 403 403 403",
	/* vision        */ "401 401 401 401 ok ok ok 403 403",
	/* models list   */ "401 401 401 401 ok ok 403 ok 403",
	/* catalog       */ "401 401 401 401 ok ok 403 ok 403",
	/* pull          */ "401 401 401 401 403 ok 403 ok 403",
	/* usage         */ "401 401 401 401 403 ok 403 403 403",
	/* keys          */ "401 401 401 401 403 ok 403 403 403",
	/* policy        */ "401 401 401 401 403 ok 403 403 403",
	/* cat. refresh  */ "401 401 401 401 403 ok 403 403 403",
	/* metrics       */ "401 401 401 401 ok ok 403 403 403",
	/* dash data     */ "401 401 401 401 ok ok 403 403 403",
	/* readyz        */ "ok ok ok ok ok ok ok ok ok",
	/* dashboard     */ "ok ok ok ok ok ok ok ok ok",
	/* unknown path  */ "401 401 401 401 ok ok ok ok ok",
}

// Loopback caller on a loopback-only node: no key and unknown keys are the
// operator; revoked and expired keys are refused; valid keys keep their
// allowlists.
var loopbackTable = []string{
	/* chat          */ "ok ok 401 401 ok ok 403 403 ok",
	/* embeddings    */ "ok ok 401 401 ok ok 403 403 403",
	/* batch submit  */ "ok ok 401 401 ok ok 403 403 403",
	/* batch poll    */ "ok ok 401 401 ok ok 403 403 403",
	/* images        */ "ok ok 401 401 ok ok 403 403 403",
	/* audio         */ "ok ok 401 401 ok ok 403 403 403",
	/* vision        */ "ok ok 401 401 ok ok ok 403 403",
	/* models list   */ "ok ok 401 401 ok ok 403 ok 403",
	/* catalog       */ "ok ok 401 401 ok ok 403 ok 403",
	/* pull          */ "ok ok 401 401 403 ok 403 ok 403",
	/* usage         */ "ok ok 401 401 403 ok 403 403 403",
	/* keys          */ "ok ok 401 401 403 ok 403 403 403",
	/* policy        */ "ok ok 401 401 403 ok 403 403 403",
	/* cat. refresh  */ "ok ok 401 401 403 ok 403 403 403",
	/* metrics       */ "ok ok 401 401 ok ok 403 403 403",
	/* dash data     */ "ok ok 401 401 ok ok 403 403 403",
	/* readyz        */ "ok ok ok ok ok ok ok ok ok",
	/* dashboard     */ "ok ok ok ok ok ok ok ok ok",
	/* unknown path  */ "ok ok 401 401 ok ok ok ok ok",
}

func codeFor(status string) string {
	switch status {
	case "401":
		return apierr.CodeInvalidAPIKey
	case "403":
		return apierr.CodePermissionDenied
	case "429":
		return apierr.CodeTooManyFailedAuth
	}
	return ""
}

func request(method, path, remote, key string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remote
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	return r
}

func check(t *testing.T, name string, c Caller, d *Denial, want string) {
	t.Helper()
	if want == "ok" {
		if d != nil {
			t.Errorf("%s: denied %d %s (%s), want admitted", name, d.Status, d.Code, d.Message)
		}
		return
	}
	if d == nil {
		t.Errorf("%s: admitted as %+v, want %s %s", name, c, want, codeFor(want))
		return
	}
	if strconv.Itoa(d.Status) != want || d.Code != codeFor(want) {
		t.Errorf("%s: got %d %s, want %s %s", name, d.Status, d.Code, want, codeFor(want))
	}
	if d.Message == "" || d.Type == "" {
		t.Errorf("%s: denial without type or message: %+v", name, d)
	}
}

func runTable(t *testing.T, cfg Config, remote, client string, table []string) {
	t.Helper()
	if len(table) != len(endpoints) {
		t.Fatalf("table has %d rows for %d endpoints", len(table), len(endpoints))
	}
	f := newFixture()
	clk := &manualClock{now: t0}
	// A high failure limit so the wrong-key rows never trip the throttle.
	cfg.MaxFailures = 1000
	a := New(cfg, f.keys, nil, prometheus.NewRegistry(), clk.Now)
	for i, ep := range endpoints {
		want := strings.Fields(table[i])
		if len(want) != len(keyKinds) {
			t.Fatalf("row %d has %d columns", i, len(want))
		}
		for j, kind := range keyKinds {
			r := request(ep.method, ep.path, remote, f.plain[kind])
			c, d := a.Authenticate(r, client, nil)
			name := ep.method + " " + ep.path + " key=" + kind
			check(t, name, c, d, want[j])
			if d == nil && kind != "none" && kind != "wrong" && !Classify(ep.method, ep.path).Public() && c.KeyID != "key_"+kind {
				t.Errorf("%s: caller %+v, want key id key_%s", name, c, kind)
			}
		}
	}
}

func TestRemoteCallers(t *testing.T) {
	runTable(t, Config{}, "203.0.113.7:5000", "203.0.113.7", remoteTable)
}

func TestLoopbackCallerOnOpenListenerNeedsKey(t *testing.T) {
	// A node listening on all interfaces treats loopback like anyone else.
	runTable(t, Config{LoopbackListener: false}, "127.0.0.1:5000", "127.0.0.1", remoteTable)
}

func TestLoopbackCallerOnLoopbackListener(t *testing.T) {
	runTable(t, Config{LoopbackListener: true}, "127.0.0.1:5000", "127.0.0.1", loopbackTable)
	runTable(t, Config{LoopbackListener: true}, "[::1]:5000", "::1", loopbackTable)
}

func TestLoopbackRuleOffBehindTrustedProxy(t *testing.T) {
	// Behind a proxy every request comes from loopback; none is local.
	runTable(t, Config{LoopbackListener: true, TrustProxy: true}, "127.0.0.1:5000", "127.0.0.1", remoteTable)
	// X-Forwarded-For names a remote client on a proxied connection.
	runTable(t, Config{LoopbackListener: true, TrustProxy: true}, "127.0.0.1:5000", "198.51.100.2", remoteTable)
}

func TestSpoofedClientAddressIsNotLocal(t *testing.T) {
	// The connection is remote even if the computed client address says
	// loopback (a forged X-Forwarded-For on a node that trusts none).
	runTable(t, Config{LoopbackListener: true}, "203.0.113.7:5000", "127.0.0.1", remoteTable)
}

func TestLocalOperatorIdentity(t *testing.T) {
	a := New(Config{LoopbackListener: true}, NewStaticKeys(), nil, nil, nil)
	c, d := a.Authenticate(request("GET", "/v1/server/usage", "127.0.0.1:1", ""), "127.0.0.1", nil)
	if d != nil || !c.Local || !c.Admin || c.KeyID != "" || c.App != LocalApp {
		t.Fatalf("operator = %+v, %v", c, d)
	}
}

func TestForwardedCallers(t *testing.T) {
	f := newFixture()
	a := New(Config{LoopbackListener: true}, f.keys, nil, nil, func() time.Time { return t0 })
	ids := map[string]ForwardedIdentity{
		"plain":  {KeyID: "key_plain", App: "a"},
		"admin":  {KeyID: "key_admin", App: "ops", Admin: true},
		"vision": {KeyID: "key_vision", App: "cam", Endpoints: []string{"vision"}},
		"local":  {App: LocalApp, Admin: true, Local: true},
	}
	cases := []struct {
		method, path string
		who          string
		want         string
	}{
		{"POST", "/v1/chat/completions", "plain", "ok"},
		{"POST", "/v1/chat/completions", "vision", "403"},
		{"POST", "/v1/vision/faces", "vision", "ok"},
		{"GET", "/v1/server/usage", "plain", "403"},
		{"GET", "/v1/server/usage", "admin", "ok"},
		{"POST", "/v1/models/pull", "vision", "403"},
		{"POST", "/v1/models/pull", "plain", "403"}, // an empty allowlist does not include pulls
		{"GET", "/v1/server/usage", "local", "ok"},
		{"GET", "/readyz", "vision", "ok"},
	}
	for _, tc := range cases {
		id := ids[tc.who]
		// The forwarding peer connects from loopback and sends no key: the
		// loopback rule must not apply, the identity must.
		r := request(tc.method, tc.path, "127.0.0.1:4000", "")
		c, d := a.Authenticate(r, "127.0.0.1", &id)
		name := tc.method + " " + tc.path + " forwarded " + tc.who
		check(t, name, c, d, tc.want)
		if d == nil && !Classify(tc.method, tc.path).Public() {
			if !c.Forwarded || c.KeyID != id.KeyID || c.Local != id.Local {
				t.Errorf("%s: caller %+v does not carry the forwarded identity %+v", name, c, id)
			}
		}
	}
	// A forwarded identity round-trips through Caller.Forward.
	k, _ := f.keys.KeyByHash(HashKey(f.plain["pullkey"]))
	orig := callerFromKey(k)
	back := orig.Forward().Caller()
	if back.KeyID != orig.KeyID || back.App != orig.App || strings.Join(back.Endpoints, ",") != "models,pull" || !back.Forwarded {
		t.Fatalf("round trip: %+v from %+v", back, orig)
	}
}

func TestKeyHeaders(t *testing.T) {
	f := newFixture()
	a := New(Config{}, f.keys, nil, nil, func() time.Time { return t0 })
	for _, set := range []func(h http.Header, k string){
		func(h http.Header, k string) { h.Set("Authorization", "Bearer "+k) },
		func(h http.Header, k string) { h.Set("Authorization", "bearer  "+k+" ") },
		func(h http.Header, k string) { h.Set("api-key", k) },
		func(h http.Header, k string) { h.Set("x-api-key", k) },
		func(h http.Header, k string) { h.Set("Authorization", "Basic Zm9vOmJhcg=="); h.Set("x-api-key", k) },
	} {
		r := request("POST", "/v1/chat/completions", "203.0.113.1:1", "")
		set(r.Header, f.plain["plain"])
		c, d := a.Authenticate(r, "203.0.113.1", nil)
		if d != nil || c.KeyID != "key_plain" {
			t.Errorf("headers %v: caller %+v, denial %v", r.Header, c, d)
		}
	}
	r := request("POST", "/v1/chat/completions", "203.0.113.1:1", "")
	r.Header.Set("Authorization", "Basic Zm9vOmJhcg==")
	if _, d := a.Authenticate(r, "203.0.113.1", nil); d == nil || d.Status != 401 || d.Code != apierr.CodeInvalidAPIKey {
		t.Errorf("basic auth only: %v, want 401 invalid_api_key", d)
	}
}

func TestCORSPreflightNeedsNoKey(t *testing.T) {
	a := New(Config{}, NewStaticKeys(), nil, nil, nil)
	r := request("OPTIONS", "/v1/chat/completions", "203.0.113.1:1", "")
	r.Header.Set("Origin", "https://app.example")
	r.Header.Set("Access-Control-Request-Method", "POST")
	if c, d := a.Authenticate(r, "203.0.113.1", nil); d != nil || !c.Public {
		t.Fatalf("preflight: %+v %v", c, d)
	}
	// A plain OPTIONS is not a preflight.
	r.Header.Del("Access-Control-Request-Method")
	if _, d := a.Authenticate(r, "203.0.113.1", nil); d == nil || d.Status != 401 {
		t.Fatalf("plain OPTIONS: %v, want 401", d)
	}
}

func TestWrongKeyThrottle(t *testing.T) {
	f := newFixture()
	clk := &manualClock{now: t0}
	reg := prometheus.NewRegistry()
	a := New(Config{MaxFailures: 10, FailureWindow: time.Minute, BlockFor: time.Minute}, f.keys, nil, reg, clk.Now)
	attempt := func(client, kind string) *Denial {
		_, d := a.Authenticate(request("POST", "/v1/chat/completions", client+":1", f.plain[kind]), client, nil)
		return d
	}
	const bad = "198.51.100.9"
	for i := 1; i <= 9; i++ {
		if d := attempt(bad, "wrong"); d == nil || d.Status != 401 {
			t.Fatalf("wrong key %d: %v, want 401", i, d)
		}
		clk.Advance(time.Second)
	}
	d := attempt(bad, "revoked") // the tenth failure within the window
	if d == nil || d.Status != 429 || d.Code != apierr.CodeTooManyFailedAuth || d.RetryAfter != 60 {
		t.Fatalf("tenth failure: %+v, want 429 too_many_failed_auth Retry-After 60", d)
	}
	// Blocked: even the right key is refused, with the time left.
	clk.Advance(30 * time.Second)
	if d := attempt(bad, "plain"); d == nil || d.Status != 429 || d.Code != apierr.CodeTooManyFailedAuth || d.RetryAfter != 30 {
		t.Fatalf("valid key while blocked: %+v, want 429 Retry-After 30", d)
	}
	if d := attempt(bad, "none"); d == nil || d.Status != 429 {
		t.Fatalf("no key while blocked: %+v, want 429", d)
	}
	// Probes stay open; other addresses are unaffected.
	if _, d := a.Authenticate(request("GET", "/readyz", bad+":1", ""), bad, nil); d != nil {
		t.Fatalf("probe while blocked: %v", d)
	}
	if d := attempt("198.51.100.10", "plain"); d != nil {
		t.Fatalf("other client: %v", d)
	}
	clk.Advance(30 * time.Second)
	if d := attempt(bad, "plain"); d != nil {
		t.Fatalf("after the block: %v", d)
	}
	// Failures spread wider than the window never block.
	for i := 0; i < 30; i++ {
		if d := attempt(bad, "wrong"); d == nil || d.Status != 401 {
			t.Fatalf("slow wrong key %d: %v, want 401", i, d)
		}
		clk.Advance(7 * time.Second)
	}
}

func TestThrottleGroupsIPv6AndIsBounded(t *testing.T) {
	clk := &manualClock{now: t0}
	a := New(Config{MaxFailures: 3, TrackedClients: 4}, NewStaticKeys(), nil, nil, clk.Now)
	wrong, _ := NewKey()
	// Three addresses of one /64 share a counter.
	for i, addr := range []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::3"} {
		_, d := a.Authenticate(request("POST", "/v1/embeddings", "["+addr+"]:1", wrong), addr, nil)
		if i < 2 && d.Status != 401 || i == 2 && d.Status != 429 {
			t.Fatalf("attempt %d from %s: %+v", i, addr, d)
		}
	}
	for i := 0; i < 50; i++ {
		addr := "192.0.2." + strconv.Itoa(i)
		a.Authenticate(request("POST", "/v1/embeddings", addr+":1", wrong), addr, nil)
	}
	if n := a.throttle.size(); n != 4 {
		t.Fatalf("throttle remembers %d addresses, want at most 4", n)
	}
}

func TestContextCarriesCaller(t *testing.T) {
	c := Caller{KeyID: "key_1", App: "x"}
	got, ok := CallerFrom(WithCaller(context.Background(), c))
	if !ok || got.KeyID != "key_1" {
		t.Fatalf("CallerFrom = %+v, %v", got, ok)
	}
	if _, ok := CallerFrom(context.Background()); ok {
		t.Fatal("empty context has a caller")
	}
}
