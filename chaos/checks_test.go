package chaos

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These tests feed the checkers hand-made histories, each one built to
// pass or to fail, so that every checker is shown able to fail.

const sec = time.Second

// baseResult is a two-node scenario: n1 up the whole time, n2 killed at
// 10 s, restarted (starting at 14 s, up at 15 s), paused 20–25 s.
func baseResult() *Result {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	return &Result{
		Scenario: Scenario{Name: "unit", Nodes: 2},
		NodeIDs:  []string{"n1", "n2"},
		T0:       t0,
		LoadEnd:  30 * sec,
		Features: Features{Mesh: true, Keys: true},
		Opt:      Options{PropagationBound: 2 * sec},
		Transitions: []Transition{
			{At: at(0), Node: "n1", To: StateStarting}, {At: at(sec / 2), Node: "n1", To: StateUp},
			{At: at(0), Node: "n2", To: StateStarting}, {At: at(sec / 2), Node: "n2", To: StateUp},
			{At: at(10 * sec), Node: "n2", To: StateDown},
			{At: at(14 * sec), Node: "n2", To: StateStarting}, {At: at(15 * sec), Node: "n2", To: StateUp},
			{At: at(20 * sec), Node: "n2", To: StateStopped}, {At: at(25 * sec), Node: "n2", To: StateUp},
		},
		Events: []Event{
			{Seq: 0, Kind: EvKill, Nodes: []string{"n2"}, At: 10 * sec, Done: 10 * sec},
			{Seq: 1, Kind: EvRestart, Nodes: []string{"n2"}, At: 14 * sec, Done: 15 * sec},
			{Seq: 2, Kind: EvPause, Nodes: []string{"n2"}, At: 20 * sec, Done: 20 * sec},
			{Seq: 3, Kind: EvResume, Nodes: []string{"n2"}, At: 25 * sec, Done: 25 * sec},
		},
	}
}

func TestClassify(t *testing.T) {
	res := baseResult()
	rec := func(entry string, start, end time.Duration, status int, mod func(*Record)) *Record {
		r := &Record{Kind: OpEmbedRaw, Entry: entry, Start: start, End: end, Status: status}
		if mod != nil {
			mod(r)
		}
		return r
	}
	cases := []struct {
		r    *Record
		want Class
	}{
		{rec("n1", sec, sec+5, 200, nil), ClassOK},
		{rec("n1", sec, sec+5, 503, func(r *Record) { r.RetryAfter = true }), ClassShed},
		{rec("n1", sec, sec+5, 503, nil), ClassUnexpected}, // no Retry-After
		{rec("n1", sec, sec+5, 502, nil), ClassUnexpected},
		{rec("n1", sec, 11*sec, 0, func(r *Record) { r.Err, r.Timeout = "deadline", true }), ClassUnexpected},
		{rec("n2", 9*sec, 10*sec+5, 0, func(r *Record) { r.Err = "connection reset" }), ClassEntryDown},
		{rec("n2", 19*sec, 22*sec, 0, func(r *Record) { r.Err, r.Timeout = "deadline", true }), ClassEntryPaused},
		{rec("n2", 16*sec, 17*sec, 0, func(r *Record) { r.Err = "connection refused" }), ClassUnexpected},
		{rec("n1", sec, sec+5, 429, func(r *Record) { r.Kind, r.RetryAfter = OpQuota, true }), ClassLimited},
		{rec("n1", sec, sec+5, 429, func(r *Record) { r.RetryAfter = true }), ClassUnexpected}, // not the quota key
		{rec("n1", sec, sec+5, 401, func(r *Record) { r.Kind = OpKeyProbe }), ClassOK},
		{rec("n1", sec, sec+5, 200, func(r *Record) { r.Err = "body broke" }), ClassUnexpected},
		// Forwarded to n2, head out, body cut: allowed only while n2 was
		// killed or paused, and only after a 2xx head.
		{rec("n1", 9*sec, 10*sec+5, 200, func(r *Record) { r.Backend, r.Err = "n2", "unexpected EOF" }), ClassBackendCut},
		{rec("n1", 19*sec, 22*sec, 200, func(r *Record) { r.Backend, r.Err, r.Timeout = "n2", "deadline", true }), ClassBackendCut},
		{rec("n1", 16*sec, 17*sec, 200, func(r *Record) { r.Backend, r.Err = "n2", "unexpected EOF" }), ClassUnexpected},  // n2 up
		{rec("n1", 9*sec, 10*sec+5, 0, func(r *Record) { r.Backend, r.Err = "n2", "connection reset" }), ClassUnexpected}, // no head: should have failed over
		{rec("n2", 9*sec, 10*sec+5, 502, func(r *Record) { r.Backend = "n2" }), ClassEntryDown},
	}
	for i, c := range cases {
		res.Records = append(res.Records, c.r)
		_ = i
	}
	Classify(res)
	for i, c := range cases {
		if c.r.Class != c.want {
			t.Errorf("case %d (%+v): class %s, want %s (%s)", i, *c.r, c.r.Class, c.want, c.r.Why)
		}
	}
	v := CheckAvailability(res)
	if v.Status != Fail || v.Count != 8 {
		t.Errorf("availability: %s with %d violations, want fail with 8: %v", v.Status, v.Count, v.Violations)
	}
	res.Records = res.Records[:2]
	Classify(res)
	if v := CheckAvailability(res); v.Status != Pass {
		t.Errorf("availability of clean records: %s %v", v.Status, v.Violations)
	}
	res.Records = nil
	if v := CheckAvailability(res); v.Status != Fail {
		t.Errorf("availability without requests: %s, want fail", v.Status)
	}
}

func TestHorizon(t *testing.T) {
	imp := BuildImpairments(baseResult())
	b := 2 * sec
	cases := []struct {
		node string
		s    time.Duration
		want time.Duration
	}{
		{"n1", 8 * sec, 6 * sec},   // connected: s - bound
		{"n2", 8 * sec, 6 * sec},   // before its kill
		{"n2", 12 * sec, 8 * sec},  // down since 10 s: 10 - 2
		{"n2", 16 * sec, 8 * sec},  // within bound of being ready again
		{"n2", 18 * sec, 16 * sec}, // caught up
		{"n2", 26 * sec, 18 * sec}, // resumed at 25 s: paused since 20 s
	}
	for _, c := range cases {
		if got := imp.Horizon(c.node, c.s, b); got != c.want {
			t.Errorf("Horizon(%s, %s) = %s, want %s", c.node, c.s, got, c.want)
		}
	}
}

// keyRecs builds a key history: create k0 acknowledged at 1 s, revoke
// acknowledged at 5 s, and the reads given.
func keyRecs(reads ...*Record) []*Record {
	recs := []*Record{
		{Seq: 1, Kind: OpKeyCreate, Entry: "n1", KeyName: "k0", Start: sec / 2, End: sec, Status: 200},
		{Seq: 2, Kind: OpKeyRevoke, Entry: "n1", KeyName: "k0", Start: 4 * sec, End: 5 * sec, Status: 200},
	}
	return append(recs, reads...)
}

func read(entry string, start time.Duration, keys ...KeyObs) *Record {
	return &Record{Seq: 10 + int(start/time.Millisecond), Kind: OpKeyList, Entry: entry, Start: start, End: start + 10*time.Millisecond, Status: 200, Keys: keys}
}

func TestKeyLinearizability(t *testing.T) {
	active := KeyObs{Name: "k0", ID: "key_1"}
	revoked := KeyObs{Name: "k0", ID: "key_1", Revoked: true}
	cases := []struct {
		name  string
		recs  []*Record
		legal bool
	}{
		{"in order", keyRecs(read("n1", 2*sec, active), read("n1", 6*sec, revoked)), true},
		{"stale within bound", keyRecs(read("n1", 6*sec, active)), true},
		{"stale past bound", keyRecs(read("n1", 8*sec, active)), false},
		{"create vanished", keyRecs(read("n1", 3500*time.Millisecond)), false},
		{"revoked before revoke was sent", keyRecs(read("n1", 1500*time.Millisecond, revoked), read("n1", 3600*time.Millisecond, active)), false},
		{"stale on a paused node", keyRecs(read("n2", 26*sec, active)), false},
		{"back in time", keyRecs(read("n1", 2*sec, active), read("n1", 7500*time.Millisecond, revoked), read("n1", 7600*time.Millisecond, active)), false},
	}
	for _, c := range cases {
		res := baseResult()
		res.Records = c.recs
		imp := BuildImpairments(res)
		hist := KeyHistory(res, imp, 2*sec)
		model := KeyModel()
		ok := true
		for _, part := range model.Partition(hist) {
			if r, _, _ := checkPartition(model, part); !r {
				ok = false
			}
		}
		if ok != c.legal {
			t.Errorf("%s: linearizable=%v, want %v", c.name, ok, c.legal)
		}
	}
	// A paused node may lag: the same stale read from n2 at 21 s (paused
	// since 20 s, revoke acknowledged at 5 s) is still illegal, but at 6.5 s
	// on n1 (within bound) it is fine; both shown above. A lost create may
	// or may not have happened:
	res := baseResult()
	res.Records = []*Record{
		{Seq: 1, Kind: OpKeyCreate, Entry: "n1", KeyName: "k9", Start: sec, End: 2 * sec, Err: "timeout", Timeout: true},
		read("n1", 5*sec), read("n1", 6*sec, KeyObs{Name: "k9"}),
	}
	hist := KeyHistory(res, BuildImpairments(res), 2*sec)
	if r, _, _ := checkPartition(KeyModel(), hist); !r {
		t.Error("a create with a lost answer that shows up later should be legal")
	}
}

func TestCheckKeysProbesAndFinalReads(t *testing.T) {
	res := baseResult()
	res.Dir = t.TempDir()
	res.Keys = []KeyEntry{{Name: "k0", ID: "key_1", CreateAcked: true, CreateAt: sec, CreateCalled: sec / 2,
		RevokeCalled: 4 * sec, RevokeAcked: true, RevokeAt: 5 * sec}}
	res.Convergence = Convergence{Converged: true, Bound: 30 * sec}
	probe := func(entry string, start time.Duration, status int) *Record {
		return &Record{Kind: OpKeyProbe, Entry: entry, KeyName: "k0", Start: start, End: start + 5*time.Millisecond, Status: status}
	}
	final := read("n1", 29*sec, KeyObs{Name: "k0", ID: "key_1", Revoked: true})
	final.Final = true
	res.Records = keyRecs(probe("n1", 3*sec, 200), probe("n1", 6*sec, 200), probe("n1", 6*sec, 401), final)
	v := CheckKeys(res, BuildImpairments(res))
	if v.Status != Pass {
		t.Fatalf("clean key history: %s %v", v.Status, v.Violations)
	}
	for _, bad := range []struct {
		name string
		rec  *Record
	}{
		{"revoked key accepted after the bound", probe("n1", 9*sec, 200)},
		{"created key refused after the bound", probe("n1", 3500*time.Millisecond, 401)},
	} {
		res.Records = append(keyRecs(final), bad.rec)
		if v := CheckKeys(res, BuildImpairments(res)); v.Status != Fail {
			t.Errorf("%s: %s, want fail", bad.name, v.Status)
		}
	}
	lost := read("n2", 29*sec, KeyObs{Name: "k0", ID: "key_1"})
	lost.Final = true
	res.Records = append(keyRecs(), final, lost)
	if v := CheckKeys(res, BuildImpairments(res)); v.Status != Fail || !strings.Contains(strings.Join(v.Violations, " "), "revoke of k0") {
		t.Errorf("a final read that lost the revoke: %s %v", v.Status, v.Violations)
	}
}

func TestCheckLimits(t *testing.T) {
	res := baseResult()
	res.QuotaLimit = 3
	quota := func(status int) *Record { return &Record{Kind: OpQuota, Entry: "n1", Status: status} }
	res.Records = []*Record{quota(200), quota(200), quota(200), quota(429), quota(429)}
	if v := CheckLimits(res); v.Status != Pass {
		t.Errorf("3 of 3 admitted: %s %v", v.Status, v.Violations)
	}
	res.Records = append(res.Records, quota(200))
	if v := CheckLimits(res); v.Status != Fail {
		t.Errorf("4 of 3 admitted: %s, want fail", v.Status)
	}
	res.Features.Keys = false
	if v := CheckLimits(res); v.Status != Skipped {
		t.Errorf("without keys: %s, want skipped", v.Status)
	}
}

func TestCheckHygieneAndConvergence(t *testing.T) {
	res := baseResult()
	res.Exits = []Exit{{Node: "n2", Expected: "SIGKILL", Signal: "killed"}, {Node: "n1", Expected: "teardown"}}
	if v := CheckHygiene(res); v.Status != Pass {
		t.Errorf("clean exits: %s %v", v.Status, v.Violations)
	}
	for _, bad := range []Exit{
		{Node: "n1", Code: 2},
		{Node: "n1", Expected: "SIGTERM", Code: 1},
		{Node: "n1", Expected: "SIGKILL", Crash: []string{"panic: boom"}},
	} {
		res.Exits = []Exit{bad}
		if v := CheckHygiene(res); v.Status != Fail {
			t.Errorf("exit %+v: %s, want fail", bad, v.Status)
		}
	}
	res.Exits = nil
	res.Cleanup = []string{"node processes still running: [42]"}
	if v := CheckHygiene(res); v.Status != Fail {
		t.Errorf("leftover process: %s, want fail", v.Status)
	}
	res.Convergence = Convergence{Bound: 30 * sec, Why: "n2 sees 1 healthy peers"}
	if v := CheckConvergence(res); v.Status != Fail {
		t.Errorf("not converged: %s, want fail", v.Status)
	}
	res.Convergence = Convergence{Bound: 30 * sec, Converged: true, After: sec}
	if v := CheckConvergence(res); v.Status != Pass {
		t.Errorf("converged: %s", v.Status)
	}
}

func TestParseMembers(t *testing.T) {
	ms, err := parseMembers([]byte(`{"object":"list","data":[{"id":"n1","state":"ready","self":true},{"id":"n2","state":"alive","ejected":true},{"id":"n3","state":"draining"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := ""
	for _, m := range ms {
		got += m.ID + "=" + map[bool]string{true: "up", false: "out"}[m.Healthy()] + " "
	}
	if got != "n1=up n2=out n3=out " {
		t.Errorf("members: %q", got)
	}
	if _, err := parseMembers([]byte(`{"data":[{"state":"ready"}]}`)); err == nil {
		t.Error("a peer without id was accepted")
	}
}

func TestAgreedAt(t *testing.T) {
	nodes := []*Node{{ID: "n1"}, {ID: "n2"}}
	f := Features{Members: true, Digest: true}
	obs := []Observation{
		{Round: 1, At: 10 * sec, Node: "n1", Leader: "n1", Digest: "a", Index: 5, Healthy: []string{"n1", "n2"}},
		{Round: 1, At: 10 * sec, Node: "n2", Leader: "n1", Digest: "b", Index: 4, Healthy: []string{"n1", "n2"}},
		{Round: 2, At: 11 * sec, Node: "n1", Leader: "n1", Digest: "a", Index: 5, Healthy: []string{"n1", "n2"}},
		{Round: 2, At: 11 * sec, Node: "n2", Leader: "n1", Digest: "a", Index: 5, Healthy: []string{"n1", "n2"}},
	}
	if at, ok := agreedAt(obs, nodes, f, 9*sec); !ok || at != 11*sec {
		t.Errorf("agreedAt = %s %v, want 11s", at, ok)
	}
	if _, ok := agreedAt(obs[:2], nodes, f, 9*sec); ok {
		t.Error("differing digests counted as agreement")
	}
}

func TestTimelinePNG(t *testing.T) {
	res := baseResult()
	for i := range 300 {
		res.Records = append(res.Records, &Record{Kind: OpEmbedSDK, Entry: "n1", Start: time.Duration(i) * 100 * time.Millisecond,
			End: time.Duration(i)*100*time.Millisecond + 3*time.Millisecond, Status: 200})
	}
	res.Records = append(res.Records, &Record{Kind: OpEmbedSDK, Entry: "n1", Start: 12 * sec, End: 13 * sec, Status: 502})
	Classify(res)
	sr := BuildScenarioReport(res, Check(res))
	path := filepath.Join(t.TempDir(), "t.png")
	if err := WriteTimeline(path, []ScenarioReport{sr, sr}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != tlWidth || b.Dy() != 2*tlPanelH+tlLegendH {
		t.Errorf("size %v", b)
	}
	if sr.Pass {
		t.Error("a run with a 502 passed")
	}
}

func TestSelect(t *testing.T) {
	all, err := Select("all")
	if err != nil || len(all) < 6 {
		t.Fatalf("all: %d %v", len(all), err)
	}
	short, err := Select("short")
	if err != nil || len(short) != 2 {
		t.Fatalf("short: %d %v", len(short), err)
	}
	if _, err := Select("nope"); err == nil {
		t.Error("unknown scenario accepted")
	}
}
