package limits

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/auth"
)

// freeLedger stands in for the ledger consensus reserves under
// FreeAllowanceKeyID: a key whose daily quota is the Free allowance, so
// the tests run the real raft lease protocol mesh-wide.
const freeLedger = "key_free_ledger"

func freeCluster(t *testing.T, n int, clk *consensustest.ManualClock) *consensustest.Cluster {
	t.Helper()
	c := cluster(t, n, clk)
	createKey(t, c, freeLedger, consensus.Limits{DailyQuota: FreeDailyRequests})
	c.Converged()
	return c
}

func freeConfig(plan PlanSource) Config {
	return Config{Plan: plan, FreeAllowanceKey: freeLedger}
}

var onFree = StaticPlan{Plan: PlanFree, FirstPartyApps: []string{"our-app"}}

// tool is a keyless caller on this computer whose User-Agent names a
// third-party tool.
func tool(addr, ua string) Request {
	r := chat(auth.Caller{Name: "local operator", App: auth.LocalApp, Admin: true, Local: true})
	r.ClientAddr, r.UserAgent = addr, ua
	return r
}

func TestParsePlanAndKnownTool(t *testing.T) {
	for in, want := range map[string]Plan{"": PlanPro, "pro": PlanPro, " FREE ": PlanFree} {
		if got, ok := ParsePlan(in); !ok || got != want {
			t.Errorf("ParsePlan(%q) = %q, %v", in, got, ok)
		}
	}
	if _, ok := ParsePlan("enterprise"); ok {
		t.Error("ParsePlan accepted an unknown plan")
	}
	tools := DefaultThirdPartyTools()
	for ua, want := range map[string]string{
		"aider/0.82.1": "aider",
		"Mozilla/5.0 (X11; Linux) Open-WebUI/0.6.5":  "open-webui",
		"python-httpx/0.27 LangChain/0.3":            "langchain",
		"Mozilla/5.0 (compatible; aider bot) curl/8": "",
		"OpenAI/Go 1.12.0":                           "",
		"OpenAI/Python 1.70.0":                       "",
		"ollama-js/0.5.14 (x64 linux Node.js/v22)":   "",
		"curl/8.5.0": "",
		"":           "",
		"Continue":   "continue",
		"jan-nano/1": "",
	} {
		if got := KnownTool(ua, tools); got != want {
			t.Errorf("KnownTool(%q) = %q, want %q", ua, got, want)
		}
	}
}

func TestClassify(t *testing.T) {
	s := PlanSettings{Plan: PlanFree, FirstPartyApps: []string{"our-app", "dashboard"}}
	for _, c := range []struct {
		name   string
		caller auth.Caller
		ua     string
		want   Party
	}{
		{"key of a first-party app", auth.Caller{KeyID: "k1", App: "our-app"}, "aider/1", FirstParty},
		{"admin key", auth.Caller{KeyID: "k2", App: "x", Admin: true}, "", FirstParty},
		{"key of another app", auth.Caller{KeyID: "k3", App: "their-tool"}, "", ThirdParty},
		{"key with no app", auth.Caller{KeyID: "k4"}, "OpenAI/Go 1.0", ThirdParty},
		{"operator with an SDK", auth.Caller{App: auth.LocalApp, Admin: true, Local: true}, "OpenAI/Go 1.0", FirstParty},
		{"operator with no User-Agent", auth.Caller{App: auth.LocalApp, Admin: true, Local: true}, "", FirstParty},
		{"known tool on loopback", auth.Caller{App: auth.LocalApp, Admin: true, Local: true}, "Open-WebUI/0.6", ThirdParty},
		{"legacy API tool", auth.Caller{App: "legacy"}, "Enchanted/1.7 CFNetwork/1", ThirdParty},
		{"legacy API, own script", auth.Caller{App: "legacy"}, "ollama-js/0.5", FirstParty},
	} {
		if got, _ := Classify(c.caller, c.ua, s, nil); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	// An operator's own tool list replaces the default.
	if got, tl := Classify(auth.Caller{Local: true}, "MyTool/2", s, []string{"mytool"}); got != ThirdParty || tl != "mytool" {
		t.Errorf("custom tool list: %s %q", got, tl)
	}
}

// TestFreeAllowanceMeshWide: on a Free mesh of three nodes, third-party
// callers (keyless tools on loopback and keys of other apps, each its own
// client) get exactly FreeDailyRequests requests in a day across all
// nodes under concurrent load; every refusal is 429 with
// X-Service-Upgrade until midnight UTC; first-party callers are never
// refused; the next day the allowance is back.
func TestFreeAllowanceMeshWide(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := freeCluster(t, 3, clk)
	var keys []auth.Caller
	for i := 0; i < 4; i++ {
		k := createKey(t, c, fmt.Sprintf("key_tool%d", i), consensus.Limits{})
		k.App = "their-tool"
		keys = append(keys, k)
	}
	ours := createKey(t, c, "key_ours", consensus.Limits{})
	ours.App = "our-app"
	c.Converged()
	var lims []*Limiter
	for _, id := range []string{"n1", "n2", "n3"} {
		l, _ := newLimiter(t, c.Peer(id), freeConfig(onFree), clk.Now)
		lims = append(lims, l)
	}
	var (
		admitted atomic.Int64
		wg       sync.WaitGroup
	)
	for w := 0; w < 40; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := tool(fmt.Sprintf("127.0.0.%d", w+1), "aider/0.82")
			if w < len(keys) {
				r = chat(keys[w])
			}
			d := admit(lims[w%len(lims)], r)
			if d == nil {
				admitted.Add(1)
				return
			}
			if d.Status != 429 || d.Code != apierr.CodeFreeDaily || d.RetryAfter != 12*3600 || !Upgrade(d) {
				t.Errorf("caller %d: %+v, want 429 %s with Retry-After until midnight and an upgrade", w, d, apierr.CodeFreeDaily)
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != FreeDailyRequests {
		t.Fatalf("admitted %d third-party requests across the mesh, want exactly %d", got, FreeDailyRequests)
	}
	fmt.Printf("free allowance: %d of 40 third-party requests admitted across 3 nodes\n", admitted.Load())
	// First-party callers are exempt, on every node.
	for i, l := range lims {
		if d := admit(l, chat(ours)); d != nil {
			t.Fatalf("first-party key on n%d: %v", i+1, d)
		}
		if d := admit(l, tool("127.0.0.1", "OpenAI/Go 1.12")); d != nil {
			t.Fatalf("operator's own program on n%d: %v", i+1, d)
		}
	}
	for _, l := range lims {
		waitIdle(t, l)
	}
	// A new day: the allowance is back (each caller's minute has passed).
	clk.Advance(13 * time.Hour)
	if d := admit(lims[0], tool("127.0.0.1", "aider/0.82")); d != nil {
		t.Fatalf("next day: %v", d)
	}
}

// TestFreeClientMinute: each third-party client gets one request a
// minute; the client is the key, or the address and tool of a keyless
// caller. A refusal of the daily allowance gives the minute back.
func TestFreeClientMinute(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := freeCluster(t, 1, clk)
	k := createKey(t, c, "key_t", consensus.Limits{})
	l, _ := newLimiter(t, c.Peer("n1"), freeConfig(onFree), clk.Now)
	if d := admit(l, chat(k)); d != nil {
		t.Fatal(d)
	}
	d := admit(l, chat(k))
	if d == nil || d.Status != 429 || d.Code != apierr.CodeFreeRate || d.RetryAfter != 60 || !Upgrade(d) {
		t.Fatalf("second request in a minute: %+v, want 429 %s Retry-After 60 with an upgrade", d, apierr.CodeFreeRate)
	}
	// Another client: another key, or another tool or address.
	for name, r := range map[string]Request{
		"tool A":                            tool("127.0.0.1", "aider/1"),
		"tool B":                            tool("127.0.0.1", "Cline/3"),
		"tool A elsewhere on this computer": tool("127.0.0.2", "aider/1"),
	} {
		if d := admit(l, r); d != nil {
			t.Fatalf("%s: %v", name, d)
		}
	}
	if d := admit(l, tool("127.0.0.1", "aider/2")); d == nil || d.Code != apierr.CodeFreeRate {
		t.Fatalf("tool A again: %v, want %s", d, apierr.CodeFreeRate)
	}
	clk.Advance(time.Minute)
	if d := admit(l, chat(k)); d != nil {
		t.Fatalf("a minute later: %v", d)
	}
	// 5 used; use the rest of the day's 10 with new clients.
	for i := 0; i < 5; i++ {
		if d := admit(l, tool(fmt.Sprintf("127.0.1.%d", i), "aider/1")); d != nil {
			t.Fatalf("request %d: %v", 6+i, d)
		}
	}
	clk.Advance(time.Minute)
	if d := admit(l, chat(k)); d == nil || d.Code != apierr.CodeFreeDaily {
		t.Fatalf("11th: %v, want %s", d, apierr.CodeFreeDaily)
	}
	// The daily refusal gave key_t's minute back: asked again at once, the
	// answer is still the daily allowance, not the minute.
	if d := admit(l, chat(k)); d == nil || d.Code != apierr.CodeFreeDaily {
		t.Fatalf("right after the daily refusal: %v, want %s", d, apierr.CodeFreeDaily)
	}
}

// TestFreePlanSwitchesAtRuntime: the plan is read per request; Pro lifts
// the allowance at once, Free brings it back.
func TestFreePlanSwitchesAtRuntime(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := freeCluster(t, 1, clk)
	var plan atomic.Value
	plan.Store(PlanPro)
	src := PlanFunc(func() PlanSettings { return PlanSettings{Plan: plan.Load().(Plan)} })
	l, _ := newLimiter(t, c.Peer("n1"), freeConfig(src), clk.Now)
	r := tool("127.0.0.1", "LibreChat/0.7")
	for i := 0; i < 3; i++ {
		if d := admit(l, r); d != nil {
			t.Fatalf("pro, request %d: %v", i, d)
		}
	}
	plan.Store(PlanFree)
	if d := admit(l, r); d != nil {
		t.Fatalf("free, first: %v", d)
	}
	if d := admit(l, r); d == nil || d.Code != apierr.CodeFreeRate {
		t.Fatalf("free, second: %v, want %s", d, apierr.CodeFreeRate)
	}
	plan.Store(PlanPro)
	if d := admit(l, r); d != nil {
		t.Fatalf("pro again: %v", d)
	}
	// Without a plan source the limiter is Pro.
	l2, _ := newLimiter(t, c.Peer("n1"), Config{}, clk.Now)
	for i := 0; i < 3; i++ {
		if d := admit(l2, r); d != nil {
			t.Fatalf("no plan source, request %d: %v", i, d)
		}
	}
}

// TestFreePlanLocalOnlyAndClientRPM: on Free, keyless callers (the legacy
// API) are served on this computer only; the client-address rpm applies
// to keyless callers too, but never to the local operator.
func TestFreePlanLocalOnlyAndClientRPM(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := freeCluster(t, 1, clk)
	l, _ := newLimiter(t, c.Peer("n1"), Config{Plan: onFree, FreeAllowanceKey: freeLedger, ClientRPM: 2}, clk.Now)
	legacy := chat(auth.Caller{Name: "legacy API", App: "legacy"})
	legacy.ClientAddr = "192.0.2.7"
	d := admit(l, legacy)
	if d == nil || d.Status != 403 || d.Code != apierr.CodeFreeLocalOnly || !Upgrade(d) {
		t.Fatalf("legacy caller from another computer: %+v, want 403 %s", d, apierr.CodeFreeLocalOnly)
	}
	legacy.ClientAddr = "127.0.0.1"
	for i := 0; i < 2; i++ {
		if d := admit(l, legacy); d != nil {
			t.Fatalf("legacy caller on loopback, request %d: %v", i, d)
		}
	}
	if d := admit(l, legacy); d == nil || d.Code != apierr.CodeClientRateLimit || Upgrade(d) {
		t.Fatalf("third legacy request in a minute: %v, want %s without an upgrade", d, apierr.CodeClientRateLimit)
	}
	op := tool("127.0.0.1", "")
	for i := 0; i < 4; i++ {
		if d := admit(l, op); d != nil {
			t.Fatalf("operator request %d: %v", i, d)
		}
	}
}
