package chaos

import (
	"fmt"
	"strings"
	"time"
)

// Verdict statuses.
const (
	Pass    = "pass"
	Fail    = "fail"
	Skipped = "skipped"
)

// maxListed bounds the violations listed per verdict (all are counted).
const maxListed = 40

// Verdict is one checker's answer.
type Verdict struct {
	// Check names the checker (e.g. "harness", "availability",
	// "acknowledged_writes").
	Check string `json:"check"`
	// Status is Pass, Fail or Skipped.
	Status string `json:"status"`
	// Why says why a check was skipped, or sums up a failure.
	Why string `json:"why,omitempty"`
	// Count is the number of violations; Violations lists the first ones.
	Count int `json:"violations_count"`
	// Violations holds the messages of the first maxListed (40) violations.
	Violations []string `json:"violations,omitempty"`
	// Notes are facts worth reading that are not violations.
	Notes []string `json:"notes,omitempty"`
}

func (v *Verdict) violate(format string, args ...any) {
	v.Count++
	v.Status = Fail
	if len(v.Violations) < maxListed {
		v.Violations = append(v.Violations, fmt.Sprintf(format, args...))
	}
}

func (v *Verdict) note(format string, args ...any) {
	v.Notes = append(v.Notes, fmt.Sprintf(format, args...))
}

func newVerdict(name string) Verdict { return Verdict{Check: name, Status: Pass} }

func skipped(name, why string) Verdict { return Verdict{Check: name, Status: Skipped, Why: why} }

func ms(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// Check runs every checker over a classified result.
func Check(res *Result) []Verdict {
	Classify(res)
	imp := BuildImpairments(res)
	return []Verdict{
		CheckHarness(res),
		CheckAvailability(res),
		CheckKeys(res, imp),
		CheckLimits(res),
		CheckConvergence(res),
		CheckHygiene(res),
	}
}

// CheckHarness fails when the scenario could not be carried out as written:
// the cluster did not start, a fault could not be injected, records were
// lost.
func CheckHarness(res *Result) Verdict {
	v := newVerdict("harness")
	if res.SetupErr != "" {
		v.violate("setup: %s", res.SetupErr)
	}
	if res.ScriptErr != "" {
		v.violate("fault script: %s", res.ScriptErr)
	}
	if res.LostRecords > 0 {
		v.violate("%d records lost over the recorder's cap", res.LostRecords)
	}
	for _, e := range res.Events {
		if e.Err != "" {
			v.violate("t=%s %s %v: %s", ms(e.At), e.Kind, e.Nodes, e.Err)
		}
	}
	if res.DroppedTicks > 0 {
		v.note("%d requests not sent: the client's in-flight cap was reached", res.DroppedTicks)
	}
	if res.NoNodeTicks > 0 {
		v.note("%d requests not sent: no node was live", res.NoNodeTicks)
	}
	return v
}

// CheckAvailability counts requests by class; any unexpected error is a
// violation. A run with no requests fails (nothing was shown).
func CheckAvailability(res *Result) Verdict {
	v := newVerdict("availability")
	if res.SetupErr != "" && len(res.Records) == 0 {
		return skipped(v.Check, "the cluster did not start")
	}
	if len(res.Records) == 0 {
		v.violate("no requests were recorded")
		return v
	}
	counts := map[Class]int{}
	entries := map[string]int{}
	for _, r := range res.Records {
		counts[r.Class]++
		entries[r.Entry]++
		if r.Class == ClassUnexpected {
			v.violate("t=%s #%d %s into %s (backend %q): %s", ms(r.Start), r.Seq, r.Kind, r.Entry, r.Backend, r.Why)
		}
	}
	for _, c := range []Class{ClassOK, ClassShed, ClassLimited, ClassEntryDown, ClassEntryPaused, ClassBackendCut} {
		if counts[c] > 0 {
			v.note("%s: %d", c, counts[c])
		}
	}
	for _, id := range res.NodeIDs {
		if entries[id] == 0 {
			v.note("no request entered %s", id)
		}
	}
	return v
}

// CheckLimits counts, on the client side, the requests the daily-quota key
// was admitted for (2xx); more than the quota is a violation.
func CheckLimits(res *Result) Verdict {
	v := newVerdict("limits")
	if !res.Features.Keys {
		return skipped(v.Check, "needs the key admin API (keys with a daily quota)")
	}
	if res.QuotaLimit <= 0 {
		return skipped(v.Check, "no quota key was created")
	}
	var admitted, limited, other, unknown int64
	for _, r := range res.Records {
		if r.Kind != OpQuota {
			continue
		}
		switch {
		case r.OK() && r.Err == "":
			admitted++
		case r.Status == 429:
			limited++
		case r.Status == 0 || r.Status >= 500:
			unknown++
		default:
			other++
		}
	}
	if admitted+limited+other+unknown == 0 {
		v.violate("no request used the quota key")
		return v
	}
	limit := res.QuotaLimit
	if d0, d1 := res.T0.UTC().YearDay(), res.T0.Add(res.LoadEnd).UTC().YearDay(); d0 != d1 {
		limit *= 2
		v.note("the run crossed midnight UTC: two daily periods, limit counted twice")
	}
	if admitted > limit {
		v.violate("daily quota %d, but %d requests were admitted (client count)", limit, admitted)
	}
	v.note("quota %d: admitted %d, refused 429 %d, no answer or 5xx %d, other %d", limit, admitted, limited, unknown, other)
	if admitted < limit && limited > 0 {
		v.note("under-admitted by %d while refusing: allowed (≤ quota), a lease left stranded", limit-admitted)
	}
	return v
}

// CheckConvergence turns the convergence wait into a verdict.
func CheckConvergence(res *Result) Verdict {
	v := newVerdict("convergence")
	c := res.Convergence
	if c.Bound == 0 {
		return skipped(v.Check, "the scenario did not get that far")
	}
	if !c.Converged {
		v.violate("not converged within %s of the last recovery (t=%s): %s", c.Bound, ms(c.From), c.Why)
	} else {
		v.note("agreed %s after the last recovery (bound %s)", c.After.Round(10*time.Millisecond), c.Bound)
	}
	for _, u := range c.Unchecked {
		v.note("not checked: %s", u)
	}
	return v
}

// CheckHygiene fails on a node that exited without being killed on purpose,
// a drain that did not exit 0, crash lines in a node log, and anything left
// behind (processes, firewall rules).
func CheckHygiene(res *Result) Verdict {
	v := newVerdict("hygiene")
	for _, e := range res.Exits {
		switch {
		case e.Expected == "":
			v.violate("%s (incarnation %d) exited unexpectedly: code %d %s; log ends: %s", e.Node, e.Incarnation, e.Code, e.Signal, strings.Join(e.LastLines, " | "))
		case e.Expected == "SIGTERM" && (e.Code != 0 || e.Signal != ""):
			v.violate("%s drained after SIGTERM but exited with code %d %s", e.Node, e.Code, e.Signal)
		}
		for _, line := range e.Crash {
			v.violate("%s log: %s", e.Node, line)
		}
	}
	for _, c := range res.Cleanup {
		v.violate("cleanup: %s", c)
	}
	if len(res.Exits) == 0 && res.SetupErr == "" {
		v.violate("no node exit was recorded: teardown did not run")
	}
	return v
}
