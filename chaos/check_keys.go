package chaos

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Key states in the linearizability model (one register per key name).
const (
	keyAbsent  = 0
	keyActive  = 1
	keyRevoked = 2
)

func keyStateName(s int) string {
	switch s {
	case keyAbsent:
		return "absent"
	case keyActive:
		return "active"
	case keyRevoked:
		return "revoked"
	}
	return fmt.Sprintf("state(%d)", s)
}

// keyInput is an operation on one key name.
type keyInput struct {
	Op   string // create, revoke, read
	Name string
}

// keyOutput is what the client learnt. Known is false when the answer was
// lost (no answer, 5xx): the operation may or may not have taken effect.
type keyOutput struct {
	Known    bool
	OK       bool
	NotFound bool
	State    int // reads
}

// KeyModel is the porcupine model of the key table, partitioned by key
// name: create takes absent to active, revoke takes active (or revoked) to
// revoked, a read returns the state. Lost answers branch.
func KeyModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var names []string
			for _, op := range h {
				n := op.Input.(keyInput).Name
				if _, ok := by[n]; !ok {
					names = append(names, n)
				}
				by[n] = append(by[n], op)
			}
			out := make([][]porcupine.Operation, 0, len(names))
			for _, n := range names {
				out = append(out, by[n])
			}
			return out
		},
		Init: func() []any { return []any{keyAbsent} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(int), input.(keyInput), output.(keyOutput)
			return keyStep(s, in, out)
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(keyInput), output.(keyOutput)
			switch {
			case in.Op == "read":
				return fmt.Sprintf("read(%s) -> %s", in.Name, keyStateName(out.State))
			case !out.Known:
				return fmt.Sprintf("%s(%s) -> ?", in.Op, in.Name)
			case out.NotFound:
				return fmt.Sprintf("%s(%s) -> not found", in.Op, in.Name)
			default:
				return fmt.Sprintf("%s(%s) -> ok=%v", in.Op, in.Name, out.OK)
			}
		},
		DescribeState: func(state any) string { return keyStateName(state.(int)) },
	}
	return nm.ToModel()
}

func keyStep(s int, in keyInput, out keyOutput) []any {
	switch in.Op {
	case "create":
		switch {
		case !out.Known && s == keyAbsent:
			return []any{keyAbsent, keyActive}
		case !out.Known || !out.OK:
			return []any{s}
		case s == keyAbsent:
			return []any{keyActive}
		}
	case "revoke":
		switch {
		case !out.Known && s == keyActive:
			return []any{keyActive, keyRevoked}
		case !out.Known:
			return []any{s}
		case out.OK && s != keyAbsent:
			return []any{keyRevoked}
		case out.NotFound && s == keyAbsent:
			return []any{s}
		case !out.OK && !out.NotFound:
			return []any{s}
		}
	case "read":
		if out.State == s {
			return []any{s}
		}
	}
	return nil
}

// definite reports whether a write's answer says for sure whether it took
// effect: 2xx did, 4xx did not; no answer or 5xx may have.
func definite(r *Record) bool {
	return r.Err == "" && r.Status >= 200 && r.Status < 500
}

// nodeIndex maps "nX" to X-1 (the client row in porcupine's picture).
func nodeIndex(id string) int {
	var i int
	if _, err := fmt.Sscanf(id, "n%d", &i); err != nil || i < 1 {
		return 0
	}
	return i - 1
}

// KeyHistory turns the recorded key operations into a porcupine history.
// Reads are local (they may lag), so a read's call time is moved back to
// its horizon: bound before its start, or bound before the impairment its
// node was in.
func KeyHistory(res *Result, imp *Impairments, bound time.Duration) []porcupine.Operation {
	var h []porcupine.Operation
	calls := map[string]time.Duration{} // name -> first create call
	for _, r := range res.Records {
		if r.Kind == OpKeyCreate && r.KeyName != "" {
			if c, ok := calls[r.KeyName]; !ok || r.Start < c {
				calls[r.KeyName] = r.Start
			}
		}
	}
	for _, r := range res.Records {
		switch r.Kind {
		case OpKeyCreate, OpKeyRevoke:
			if r.KeyName == "" {
				continue
			}
			out := keyOutput{Known: definite(r), OK: r.OK(), NotFound: r.Status == 404}
			ret := int64(r.End)
			if !out.Known {
				ret = int64(forever)
			}
			op := "create"
			if r.Kind == OpKeyRevoke {
				op = "revoke"
			}
			h = append(h, porcupine.Operation{ClientId: nodeIndex(r.Entry), Input: keyInput{Op: op, Name: r.KeyName}, Call: int64(r.Start), Output: out, Return: ret})
		case OpKeyList:
			if !r.OK() || r.Err != "" {
				continue
			}
			seen := map[string]KeyObs{}
			for _, k := range r.Keys {
				seen[k.Name] = k
			}
			call := min(r.Start, imp.Horizon(r.Entry, r.Start, bound))
			for name, c := range calls {
				if c > r.End {
					continue
				}
				st := keyAbsent
				if k, ok := seen[name]; ok {
					st = keyActive
					if k.Revoked {
						st = keyRevoked
					}
				}
				h = append(h, porcupine.Operation{ClientId: nodeIndex(r.Entry), Input: keyInput{Op: "read", Name: name}, Call: int64(call), Output: keyOutput{Known: true, State: st}, Return: int64(r.End)})
			}
		}
	}
	return h
}

// CheckKeys checks the key history: linearizable with bounded-staleness
// reads (porcupine), no acknowledged create or revoke missing from the
// final reads, no revoked key accepted and no created key refused once its
// write had time to reach a connected node.
func CheckKeys(res *Result, imp *Impairments) Verdict {
	v := newVerdict("acknowledged_writes")
	if !res.Features.Keys {
		return skipped(v.Check, "needs the key admin API (POST/GET/DELETE /v1/server/keys)")
	}
	bound := res.Opt.PropagationBound
	hist := KeyHistory(res, imp, bound)
	model := KeyModel()
	parts := model.Partition(hist)
	var creates, revokes, reads int
	for _, op := range hist {
		switch op.Input.(keyInput).Op {
		case "create":
			creates++
		case "revoke":
			revokes++
		default:
			reads++
		}
	}
	if creates == 0 {
		v.violate("no key was created: the history shows nothing")
	}
	for _, part := range parts {
		ok, result, info := checkPartition(model, part)
		name := part[0].Input.(keyInput).Name
		switch {
		case ok:
		case result == porcupine.Illegal:
			path := "(no folder for a visualization)"
			if res.Dir != "" {
				path = filepath.Join(res.Dir, "keys-"+name+".html")
				if err := porcupine.VisualizePath(model, info, path); err != nil {
					path = "(visualization failed: " + err.Error() + ")"
				}
			}
			v.violate("key %s: history not linearizable (%d ops; see %s)", name, len(part), path)
		default:
			v.violate("key %s: linearizability check timed out (%d ops)", name, len(part))
		}
	}
	v.note("porcupine: %d keys, %d creates, %d revokes, %d reads (read horizon: %s, longer for impaired nodes)", len(parts), creates, revokes, reads, bound)
	checkFinalReads(res, &v)
	checkProbes(res, imp, bound, &v)
	return v
}

// checkPartition checks one key's history (20 s limit).
func checkPartition(model porcupine.Model, part []porcupine.Operation) (bool, porcupine.CheckResult, porcupine.LinearizationInfo) {
	result, info := porcupine.CheckOperationsVerbose(model, part, 20*time.Second)
	return result == porcupine.Ok, result, info
}

// checkFinalReads: after convergence every node must list every key whose
// create was acknowledged, revoked when its revoke was acknowledged.
func checkFinalReads(res *Result, v *Verdict) {
	var finals []*Record
	for _, r := range res.Records {
		if r.Final {
			finals = append(finals, r)
		}
	}
	if len(finals) == 0 {
		if res.Convergence.Converged {
			v.violate("no final reads were made")
		}
		return
	}
	for _, r := range finals {
		if !r.OK() || r.Err != "" {
			v.violate("final read on %s failed: status %d %s %s", r.Entry, r.Status, r.Code, r.Err)
			continue
		}
		seen := map[string]KeyObs{}
		for _, k := range r.Keys {
			seen[k.Name] = k
		}
		for _, k := range res.Keys {
			got, ok := seen[k.Name]
			switch {
			case k.CreateAcked && !ok:
				v.violate("acknowledged create of %s (t=%s) vanished: %s does not list it", k.Name, ms(k.CreateAt), r.Entry)
			case k.RevokeAcked && !got.Revoked:
				v.violate("acknowledged revoke of %s (t=%s) vanished: %s lists it active", k.Name, ms(k.RevokeAt), r.Entry)
			}
		}
	}
}

// checkProbes judges every probe (GET /v1/models with a created key).
func checkProbes(res *Result, imp *Impairments, bound time.Duration, v *Verdict) {
	book := map[string]KeyEntry{}
	for _, k := range res.Keys {
		book[k.Name] = k
	}
	var accepted, refused, excused int
	for _, r := range res.Records {
		if r.Kind != OpKeyProbe || r.Err != "" {
			continue
		}
		k, ok := book[r.KeyName]
		if !ok {
			continue
		}
		h := imp.Horizon(r.Entry, r.Start, bound)
		switch {
		case r.OK():
			accepted++
			if k.RevokeAcked && k.RevokeAt < h {
				v.violate("revoked key %s accepted by %s at t=%s; revoke acknowledged at t=%s (bound %s)", k.Name, r.Entry, ms(r.Start), ms(k.RevokeAt), bound)
			} else if k.RevokeAcked && k.RevokeAt < r.Start {
				excused++
			}
		case r.Status == 401:
			refused++
			revokeSent := k.RevokeCalled > 0 && k.RevokeCalled < r.End
			if !revokeSent && k.CreateAcked && k.CreateAt < h {
				v.violate("key %s refused (401) by %s at t=%s; create acknowledged at t=%s (bound %s)", k.Name, r.Entry, ms(r.Start), ms(k.CreateAt), bound)
			} else if !revokeSent && k.CreateAcked && k.CreateAt < r.Start {
				excused++
			}
		}
	}
	v.note("probes: %d accepted, %d refused; %d within the propagation bound or during an impairment (allowed)", accepted, refused, excused)
	if accepted+refused == 0 && res.Features.Keys && slices.ContainsFunc(res.Keys, func(k KeyEntry) bool { return k.CreateAcked }) {
		v.violate("no probe got an answer (200 or 401): key acceptance was never tested")
	}
}
