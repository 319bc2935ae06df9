package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

func optDur(d *time.Duration) string {
	if d == nil {
		return "—"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func latStr(l LatencyStat) string {
	if l.N == 0 {
		return fmt.Sprintf("—/— (%d err)", l.Errors)
	}
	return fmt.Sprintf("%.0f/%.0f ms n=%d err=%d", l.P50ms, l.P99ms, l.N, l.Errors)
}

// sortedKeys returns a map's keys in order.
func sortedKeys[K ~string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func counts[K ~string](m map[K]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func verdictOf(vs []Verdict, check string) Verdict {
	for _, v := range vs {
		if v.Check == check {
			return v
		}
	}
	return Verdict{Check: check, Status: Skipped}
}

// WriteSummary writes the human-readable summary: one section per scenario
// and a closing table.
func (rep *Report) WriteSummary(w io.Writer) {
	fmt.Fprintf(w, "infermesh chaos run %s\n", rep.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "binary %s, namespace %s\n", rep.Binary, rep.Namespace)
	if sec, _ := rep.Options["secure"].(bool); sec {
		fmt.Fprintln(w, "secured: TLS on client ports, mutual TLS between nodes, cluster secret, keyed clients")
	}
	f := rep.Features
	fmt.Fprintf(w, "features: mesh=%v partitions=%v state-digest=%v members=%v keys=%v\n", f.Mesh, f.Partitions, f.Digest, f.Members, f.Keys)
	if len(f.MissingFlags) > 0 {
		fmt.Fprintf(w, "  serve lacks flags: --%s\n", strings.Join(f.MissingFlags, ", --"))
	}
	if f.NoPartitionWhy != "" {
		fmt.Fprintf(w, "  no partitions: %s\n", f.NoPartitionWhy)
	}
	if f.Standalone {
		fmt.Fprintln(w, "  STANDALONE: nodes are NOT joined; this run tests the harness, not the mesh")
	}
	for _, sr := range rep.Scenarios {
		fmt.Fprintln(w)
		if len(sr.Skipped) > 0 {
			fmt.Fprintf(w, "== %s: SKIPPED — needs %s (%s)\n", sr.Name, needsList(sr.Skipped), sr.Title)
			continue
		}
		status := "PASS"
		if !sr.Pass {
			status = "FAIL"
		}
		fmt.Fprintf(w, "== %s: %s [%s]\n", sr.Name, sr.Title, status)
		fmt.Fprintf(w, "   %d nodes, load %.0fs at %.0f req/s, seed %d, folder %s\n", sr.Nodes, sr.LoadSeconds, sr.Rate, sr.Seed, sr.Dir)
		fmt.Fprintf(w, "   requests %d by class: %s\n", sr.Requests, counts(sr.ByClass))
		fmt.Fprintf(w, "   by outcome: %s\n", counts(sr.ByOutcome))
		fmt.Fprintf(w, "   by kind: %s\n", counts(sr.ByKind))
		if len(sr.ErrorKinds) > 0 {
			fmt.Fprintf(w, "   error classes: %s\n", counts(sr.ErrorKinds))
		}
		fmt.Fprintf(w, "   latency of ok inference requests: %s\n", latStr(sr.Overall))
		if len(sr.Faults) > 0 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "   fault\tat\trecovered\tp50/p99 before\tduring\tafter\trouting change\tnew leader\tserved again")
			for _, fs := range sr.Faults {
				e := fs.Event
				what := string(e.Kind) + " " + strings.Join(e.Nodes, ",")
				if e.Kind.isPartition() && len(e.Groups) == 2 {
					what = fmt.Sprintf("%s %v|%v", e.Kind, e.Groups[0], e.Groups[1])
				}
				fmt.Fprintf(tw, "   %s\t%.1fs\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", what, e.At.Seconds(), optDurAbs(fs.EndAt),
					latStr(fs.Before), latStr(fs.During), latStr(fs.After), optDur(fs.RoutingChange), optDur(fs.NewLeader), optDur(fs.ServedAgain))
			}
			tw.Flush()
		}
		c := sr.Convergence
		switch {
		case c.Bound == 0:
		case c.Converged:
			fmt.Fprintf(w, "   convergence: %.2fs after the last recovery at %.1fs (bound %s)", c.After.Seconds(), c.From.Seconds(), c.Bound)
			if c.Leader != "" {
				fmt.Fprintf(w, "; leader %s, digest %.12s", c.Leader, c.Digest)
			}
			fmt.Fprintln(w)
		default:
			fmt.Fprintf(w, "   convergence: NOT within %s: %s\n", c.Bound, c.Why)
		}
		for _, v := range sr.Verdicts {
			line := fmt.Sprintf("   %-20s %s", v.Check, strings.ToUpper(v.Status))
			if v.Why != "" {
				line += " — " + v.Why
			}
			if v.Count > 0 {
				line += fmt.Sprintf(" (%d violations)", v.Count)
			}
			fmt.Fprintln(w, line)
			for _, x := range v.Violations {
				fmt.Fprintf(w, "        ✗ %s\n", x)
			}
			if v.Count > len(v.Violations) {
				fmt.Fprintf(w, "        … %d more in the JSON report\n", v.Count-len(v.Violations))
			}
			for _, n := range v.Notes {
				fmt.Fprintf(w, "        · %s\n", n)
			}
		}
	}
	fmt.Fprintln(w)
	rep.WriteTable(w)
	if rep.Host != nil {
		fmt.Fprintf(w, "host hygiene: %s", strings.ToUpper(rep.Host.Status))
		for _, x := range rep.Host.Violations {
			fmt.Fprintf(w, "\n  ✗ %s", x)
		}
		fmt.Fprintln(w)
	}
	verdict := "PASS"
	if !rep.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "RESULT: %s\n", verdict)
}

func optDurAbs(d *time.Duration) string {
	if d == nil {
		return "never"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// WriteTable writes the closing table, one row per scenario.
func (rep *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tnodes\trequests\tok\tallowed\tunexpected\tp50 ms\tp99 ms\tconverged\tavail\twrites\tlimits\tconv\thygiene\tharness\tresult")
	for _, sr := range rep.Scenarios {
		if len(sr.Skipped) > 0 {
			fmt.Fprintf(tw, "%s\t%d\t\t\t\t\t\t\t\t\t\t\t\t\t\tskipped (needs %s)\n", sr.Name, sr.Nodes, needsList(sr.Skipped))
			continue
		}
		ok := sr.ByClass[ClassOK]
		unexpected := sr.ByClass[ClassUnexpected]
		conv := "—"
		if sr.Convergence.Converged {
			conv = fmt.Sprintf("%.1fs", sr.Convergence.After.Seconds())
		} else if sr.Convergence.Bound > 0 {
			conv = "no"
		}
		result := "PASS"
		if !sr.Pass {
			result = "FAIL"
		}
		v := func(c string) string { return verdictOf(sr.Verdicts, c).Status }
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sr.Name, sr.Nodes, sr.Requests, ok,
			sr.Requests-ok-unexpected, unexpected, sr.Overall.P50ms, sr.Overall.P99ms, conv,
			v("availability"), v("acknowledged_writes"), v("limits"), v("convergence"), v("hygiene"), v("harness"), result)
	}
	tw.Flush()
}
