package limits

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/auth"
)

// Plan is the server's plan: Free or Pro. It is replicated (the pool
// policy holds it) so every node of a mesh applies the same one.
type Plan string

// Plans.
const (
	// PlanPro has no allowance: the operator's limits are the only ones.
	// An unset plan is Pro.
	PlanPro Plan = "pro"
	// PlanFree limits third-party tools to the Free allowance.
	PlanFree Plan = "free"
)

// ParsePlan reads a plan name ("free" or "pro", any case; empty is Pro).
func ParsePlan(s string) (Plan, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", string(PlanPro):
		return PlanPro, true
	case string(PlanFree):
		return PlanFree, true
	}
	return "", false
}

// The Free allowance: third-party tools on a Free server share
// FreeDailyRequests counted requests a day (UTC) across the whole mesh,
// and each client of them may make FreeClientRPM a minute.
const (
	FreeDailyRequests = consensus.FreeDailyRequests
	FreeClientRPM     = 1
)

// FreeAllowanceKeyID is the ledger the mesh-wide daily Free allowance is
// leased from: a reserved key id that consensus keeps a daily-requests
// ledger for, whose limit is FreeDailyRequests while the replicated plan is
// Free and none (unlimited) otherwise. No API key can have this id.
const FreeAllowanceKeyID = consensus.FreeAllowanceKeyID

// PlanSettings are the replicated plan settings the limiter reads.
type PlanSettings struct {
	// Plan is the server's plan; empty is Pro.
	Plan Plan
	// FirstPartyApps are the app names the operator marks first-party:
	// keys issued with one of these apps are never subject to the Free
	// allowance.
	FirstPartyApps []string
}

// PlanSource reads the replicated plan settings. It is called once per
// counted request, so it must be cheap (a local replica read).
type PlanSource interface {
	PlanSettings() PlanSettings
}

// DefaultThirdPartyTools returns the User-Agent products (the name before
// the "/" of a product token, compared without case) by which keyless
// callers are known to be third-party tools: chat front-ends, coding
// assistants and agent or workflow frameworks that talk to OpenAI- or
// Ollama-style servers. Client libraries (the OpenAI SDKs, ollama-js,
// curl) are not on the list: they are how the operator's own programs
// call the server. The slice is new on every call.
func DefaultThirdPartyTools() []string {
	return []string{
		"open-webui", "openwebui", "librechat", "lobechat", "lobe-chat", "anythingllm",
		"chatbox", "jan", "msty", "enchanted", "big-agi", "sillytavern", "typingmind",
		"page-assist", "continue", "cline", "roo-code", "aider", "cursor", "zed",
		"raycast", "obsidian-copilot", "n8n", "flowise", "dify",
		"langchain", "llamaindex", "litellm",
	}
}

// Party says whether a caller is first- or third-party.
type Party uint8

// Parties.
const (
	// FirstParty callers are the operator and the operator's apps; the
	// Free allowance never applies to them.
	FirstParty Party = iota
	// ThirdParty callers are tools the Free allowance applies to.
	ThirdParty
)

// Classify classes a caller:
//
//   - A keyed caller is first-party when its key is an admin key or was
//     issued with an app on s.FirstPartyApps; every other key is
//     third-party.
//   - A keyless caller (the local operator on loopback, or the legacy
//     API) is third-party when its User-Agent names a known tool (tools,
//     DefaultThirdPartyTools() when nil), else first-party.
//
// tool is the tool name found in the User-Agent ("" when none).
func Classify(c auth.Caller, userAgent string, s PlanSettings, tools []string) (p Party, tool string) {
	if c.KeyID != "" {
		if c.Admin || c.App != "" && slices.Contains(s.FirstPartyApps, c.App) {
			return FirstParty, ""
		}
		return ThirdParty, ""
	}
	if tools == nil {
		tools = DefaultThirdPartyTools()
	}
	if tool = KnownTool(userAgent, tools); tool != "" {
		return ThirdParty, tool
	}
	return FirstParty, ""
}

// KnownTool returns the first product of a User-Agent that is on tools
// (compared without case), or "". Products are the space-separated tokens
// outside parentheses, each "name/version" or just "name".
func KnownTool(userAgent string, tools []string) string {
	depth := 0
	for tok := range strings.FieldsSeq(userAgent) {
		if depth > 0 || strings.HasPrefix(tok, "(") {
			depth += strings.Count(tok, "(") - strings.Count(tok, ")")
			continue
		}
		name, _, _ := strings.Cut(tok, "/")
		for _, t := range tools {
			if strings.EqualFold(name, t) {
				return strings.ToLower(t)
			}
		}
	}
	return ""
}

// freeClient names the client the per-minute Free allowance counts: the
// key for keyed callers, else the address (IPv6 by /64) and the tool.
func freeClient(c auth.Caller, addr, tool string) string {
	if c.KeyID != "" {
		return "key\x00" + c.KeyID
	}
	return "addr\x00" + clientKey(addr) + "\x00" + tool
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr string) bool {
	ip, err := netip.ParseAddr(addr)
	return err == nil && ip.Unmap().IsLoopback()
}

// checkFree applies the Free plan to a counted request: a keyless caller
// that is not on this computer is refused (the legacy API serves its own
// computer only), and a third-party caller takes one request of its
// client's minute and one of the mesh's daily Free allowance. It returns
// nil when the plan is Pro or the caller first-party.
func (l *Limiter) checkFree(ctx context.Context, r Request, now time.Time, t *Ticket) *auth.Denial {
	if l.cfg.Plan == nil {
		return nil
	}
	s := l.cfg.Plan.PlanSettings()
	if s.Plan != PlanFree {
		return nil
	}
	c := r.Caller
	if c.KeyID == "" && !c.Local && !isLoopback(r.ClientAddr) {
		return denyFreeLocalOnly()
	}
	party, tool := Classify(c, r.UserAgent, s, l.cfg.ThirdPartyTools)
	if party == FirstParty {
		return nil
	}
	res, wait := l.freeBuckets.reserve(freeClient(c, r.ClientAddr, tool), FreeClientRPM, now)
	if res == nil {
		return denyFreeRate(wait)
	}
	t.rpm[2] = res
	a, period, d := l.take(ctx, now, l.cfg.FreeAllowanceKey, consensus.LeaseDailyRequests, 1, FreeDailyRequests)
	if d != nil {
		return freeDenial(d, now)
	}
	t.free, t.freePeriod = a, period
	return nil
}
