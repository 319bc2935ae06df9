package limits

import (
	"context"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/auth"
)

func TestKeyRPM(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	l, _ := newLimiter(t, c.Peer("n1"), Config{}, clk.Now)
	k := createKey(t, c, "key_rpm", consensus.Limits{RPM: 3})
	for i := 0; i < 3; i++ {
		if d := admit(l, chat(k)); d != nil {
			t.Fatalf("request %d: %v", i, d)
		}
	}
	d := admit(l, chat(k))
	if d == nil || d.Status != 429 || d.Code != apierr.CodeRateLimit || d.RetryAfter != 20 {
		t.Fatalf("fourth request: %+v, want 429 %s Retry-After 20", d, apierr.CodeRateLimit)
	}
	clk.Advance(10 * time.Second)
	if d := admit(l, chat(k)); d == nil || d.RetryAfter != 10 {
		t.Fatalf("10 s later: %+v, want Retry-After 10", d)
	}
	clk.Advance(10 * time.Second)
	if d := admit(l, chat(k)); d != nil {
		t.Fatalf("a token later: %v", d)
	}
	if d := admit(l, chat(k)); d == nil || d.Code != apierr.CodeRateLimit {
		t.Fatalf("right after: %v, want %s", d, apierr.CodeRateLimit)
	}
	// Uncounted requests are never limited.
	r := chat(k)
	r.Class, r.Counted = auth.ClassModels, false
	if d := admit(l, r); d != nil {
		t.Fatalf("models listing: %v", d)
	}
	// A full minute refills the whole bucket, and no more.
	clk.Advance(5 * time.Minute)
	for i := 0; i < 3; i++ {
		if d := admit(l, chat(k)); d != nil {
			t.Fatalf("after a pause, request %d: %v", i, d)
		}
	}
	if d := admit(l, chat(k)); d == nil {
		t.Fatal("burst above the rpm after a pause")
	}
}

func TestServerWideKeyRPMAndKeyOverride(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	l, _ := newLimiter(t, c.Peer("n1"), Config{KeyRPM: 2}, clk.Now)
	def := createKey(t, c, "key_def", consensus.Limits{})
	own := createKey(t, c, "key_own", consensus.Limits{RPM: 4})
	for name, tc := range map[string]struct {
		caller auth.Caller
		n      int
	}{"default": {def, 2}, "own": {own, 4}} {
		for i := 0; i < tc.n; i++ {
			if d := admit(l, chat(tc.caller)); d != nil {
				t.Fatalf("%s: request %d: %v", name, i, d)
			}
		}
		if d := admit(l, chat(tc.caller)); d == nil || d.Code != apierr.CodeRateLimit {
			t.Fatalf("%s: request %d: %v, want %s", name, tc.n, d, apierr.CodeRateLimit)
		}
	}
}

func TestClientRPM(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	l, _ := newLimiter(t, c.Peer("n1"), Config{ClientRPM: 2}, clk.Now)
	a := createKey(t, c, "key_a", consensus.Limits{RPM: 1})
	b := createKey(t, c, "key_b", consensus.Limits{})
	from := func(k auth.Caller, addr string) *auth.Denial {
		r := chat(k)
		r.ClientAddr = addr
		return admit(l, r)
	}
	if d := from(a, "198.51.100.1"); d != nil {
		t.Fatalf("first: %v", d)
	}
	// Key a's own limit refuses; the client's token is given back.
	if d := from(a, "198.51.100.1"); d == nil || d.Code != apierr.CodeRateLimit {
		t.Fatalf("key a again: %v, want %s", d, apierr.CodeRateLimit)
	}
	if d := from(b, "198.51.100.1"); d != nil {
		t.Fatalf("key b, second client token: %v", d)
	}
	d := from(b, "198.51.100.1")
	if d == nil || d.Status != 429 || d.Code != apierr.CodeClientRateLimit || d.RetryAfter != 30 {
		t.Fatalf("third from the address: %+v, want 429 %s Retry-After 30", d, apierr.CodeClientRateLimit)
	}
	if d := from(b, "198.51.100.2"); d != nil {
		t.Fatalf("another address: %v", d)
	}
	// One IPv6 /64 is one client.
	from(b, "2001:db8:5:6::1")
	from(b, "2001:db8:5:6::2")
	if d := from(b, "2001:db8:5:6:aaaa::3"); d == nil || d.Code != apierr.CodeClientRateLimit {
		t.Fatalf("third from one /64: %v, want %s", d, apierr.CodeClientRateLimit)
	}
	// The local operator is not limited.
	op := auth.Caller{App: auth.LocalApp, Admin: true, Local: true}
	for i := 0; i < 5; i++ {
		if d := from(op, "198.51.100.1"); d != nil {
			t.Fatalf("operator request %d: %v", i, d)
		}
	}
}

func TestRefusedRequestGivesTokensBack(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	l, _ := newLimiter(t, c.Peer("n1"), Config{}, clk.Now)
	k := createKey(t, c, "key_g", consensus.Limits{RPM: 2, DailyQuota: 1})
	if d := admit(l, chat(k)); d != nil {
		t.Fatalf("first: %v", d)
	}
	// Both refusals are the quota's: the quota refusal returned the
	// rate token the second request had taken.
	for i := 0; i < 2; i++ {
		if d := admit(l, chat(k)); d == nil || d.Code != apierr.CodeDailyQuota {
			t.Fatalf("refusal %d: %v, want %s", i, d, apierr.CodeDailyQuota)
		}
	}
}

func TestBucketsAreBounded(t *testing.T) {
	b := newBuckets(64)
	for i := 0; i < 1000; i++ {
		b.reserve(string(rune('a'+i%26))+time.Duration(i).String(), 5, noon)
	}
	if n := b.size(); n > 64 {
		t.Fatalf("%d buckets kept, want at most 64", n)
	}
}

func TestLocalAndForwardedCallers(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	l, _ := newLimiter(t, c.Peer("n1"), Config{KeyRPM: 1}, clk.Now)
	before := applies(c.Peer("n1"))
	op := auth.Caller{App: auth.LocalApp, Admin: true, Local: true}
	fw := auth.ForwardedIdentity{KeyID: "key_elsewhere", App: "x"}.Caller()
	for i := 0; i < 3; i++ {
		for _, who := range []auth.Caller{op, fw} {
			tk, d := l.Admit(context.Background(), chat(who))
			if d != nil {
				t.Fatalf("%+v: %v", who, d)
			}
			tk.Done(Usage{PromptTokens: 1, Status: 200})
		}
	}
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := applies(c.Peer("n1")) - before; got != 1 {
		t.Fatalf("%d raft entries, want one usage batch", got)
	}
	rows := c.Peer("n1").Node.State().UsageTotals()
	if len(rows) != 1 || rows[0].App != auth.LocalApp || rows[0].KeyID != "" || rows[0].Requests != 3 {
		t.Fatalf("usage = %+v, want the operator's 3 requests only (forwarded ones are counted where they entered)", rows)
	}
}
