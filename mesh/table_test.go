package mesh

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

func rec(id string, epoch, seq uint64, h meshv1.Health, models ...string) *meshv1.NodeRecord {
	r := &meshv1.NodeRecord{NodeId: id, Epoch: epoch, Seq: seq, Health: h}
	for _, m := range models {
		r.Models = append(r.Models, &meshv1.ModelState{Model: m, Warm: true})
	}
	return r
}

func TestTableHigherVersionWins(t *testing.T) {
	tb := newTable("self", time.Now, 0)
	tb.join(Identity{NodeID: "a", RPCAddr: "10.0.0.1:1"}, "10.0.0.1:7946")
	ready := meshv1.Health_HEALTH_READY
	steps := []struct {
		r      *meshv1.NodeRecord
		accept bool
		model  string
	}{
		{rec("a", 5, 2, ready, "m2"), true, "m2"},
		{rec("a", 5, 1, ready, "m1"), false, "m2"}, // older seq
		{rec("a", 5, 2, ready, "mX"), false, "m2"}, // same version
		{rec("a", 4, 9, ready, "m0"), false, "m2"}, // older epoch, higher seq
		{rec("a", 5, 3, ready, "m3"), true, "m3"},
		{rec("a", 6, 1, ready, "m4"), true, "m4"}, // new incarnation
	}
	for i, s := range steps {
		ch := tb.merge(s.r)
		if ch.accepted != s.accept {
			t.Fatalf("step %d: accepted=%v want %v", i, ch.accepted, s.accept)
		}
		p := tb.snapshot()[0]
		if _, ok := p.Models[s.model]; !ok || len(p.Models) != 1 {
			t.Fatalf("step %d: models %v, want only %s", i, p.Models, s.model)
		}
		if p.RPCAddr != "10.0.0.1:1" || p.GossipAddr != "10.0.0.1:7946" {
			t.Fatalf("identity lost: %+v", p)
		}
	}
}

func TestTableSignificantChanges(t *testing.T) {
	tb := newTable("self", time.Now, 0)
	tb.join(Identity{NodeID: "a"}, "")
	ready := meshv1.Health_HEALTH_READY
	if ch := tb.merge(rec("a", 1, 1, ready, "m")); !ch.significant {
		t.Fatal("the first record must count as a change")
	}
	load := rec("a", 1, 2, ready, "m")
	load.InFlight, load.QueueDepth = 7, 3
	load.Models[0].LatencyUs = 1234
	if ch := tb.merge(load); !ch.accepted || ch.significant {
		t.Fatalf("a load-only change: %+v", ch)
	}
	cold := rec("a", 1, 3, ready, "m")
	cold.Models[0].Warm = false
	if ch := tb.merge(cold); !ch.significant {
		t.Fatal("a model going cold is significant")
	}
	if ch := tb.merge(rec("a", 1, 4, meshv1.Health_HEALTH_DRAINING, "m")); !ch.significant {
		t.Fatal("a health change is significant")
	}
}

func TestTableRecordsBeforeJoinAndTombstones(t *testing.T) {
	tb := newTable("self", time.Now, 0)
	ready := meshv1.Health_HEALTH_READY
	// A record may arrive before memberlist reports the node.
	tb.merge(rec("a", 1, 3, ready, "m"))
	if len(tb.snapshot()) != 0 {
		t.Fatal("a node that has not joined is visible")
	}
	tb.join(Identity{NodeID: "a"}, "")
	if p := tb.snapshot(); len(p) != 1 || p[0].Health != route.HealthReady {
		t.Fatalf("after join: %+v", p)
	}
	if len(tb.records()) != 1 {
		t.Fatal("push-pull state misses a member's record")
	}
	if _, graceful, ok := tb.leave("a"); !ok || graceful {
		t.Fatalf("leave: ok=%v graceful=%v", ok, graceful)
	}
	// Stale copies still circulating do not resurrect the node's record.
	if ch := tb.merge(rec("a", 1, 3, ready, "m")); ch.accepted {
		t.Fatal("a tombstoned version was accepted")
	}
	if ch := tb.merge(rec("a", 1, 4, ready, "m")); !ch.accepted {
		t.Fatal("a newer version after the tombstone was refused")
	}
	last := rec("a", 1, 5, ready)
	last.Leaving = true
	tb.join(Identity{NodeID: "a"}, "")
	tb.merge(last)
	if _, graceful, _ := tb.leave("a"); !graceful {
		t.Fatal("a leave announced in the record is not graceful")
	}
	if _, _, ok := tb.leave("self"); ok {
		t.Fatal("the table removed its own node")
	}
}

func TestTableEjectRestoresOnlyOnNewerReady(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := newTable("self", func() time.Time { return now }, time.Second)
	tb.join(Identity{NodeID: "a"}, "")
	ready := meshv1.Health_HEALTH_READY
	tb.merge(rec("a", 1, 10, ready, "m"))
	if _, ok := tb.eject("a"); !ok {
		t.Fatal("eject failed")
	}
	if _, ok := tb.eject("a"); ok {
		t.Fatal("double eject reported a change")
	}
	if _, ok := tb.eject("self"); ok {
		t.Fatal("ejected itself")
	}
	if !tb.snapshot()[0].Ejected {
		t.Fatal("not ejected")
	}
	if ch := tb.merge(rec("a", 1, 11, meshv1.Health_HEALTH_ALIVE, "m")); ch.restored || !tb.snapshot()[0].Ejected {
		t.Fatal("restored by a record that is not ready")
	}
	if ch := tb.merge(rec("a", 1, 12, meshv1.Health_HEALTH_DRAINING, "m")); ch.restored {
		t.Fatal("restored by a draining record")
	}
	// A newer ready record within the hold (an echo of the node's last
	// words) does not restore it.
	if ch := tb.merge(rec("a", 1, 13, ready, "m")); ch.restored || !tb.snapshot()[0].Ejected {
		t.Fatal("restored within the hold time")
	}
	now = now.Add(time.Second)
	ch := tb.merge(rec("a", 1, 14, ready, "m"))
	if !ch.restored || !ch.significant || tb.snapshot()[0].Ejected {
		t.Fatalf("not restored by a newer ready record: %+v", ch)
	}
}

func TestLocalStateAdoptsNewerSelfRecord(t *testing.T) {
	l := newLocalState("me", 100, 0.2, time.Now)
	l.next()
	current := l.next() // (100, 2)
	if l.adopt(&meshv1.NodeRecord{NodeId: "me", Epoch: 100, Seq: 1}) {
		t.Fatal("adopted an older version")
	}
	// A peer echoing the record just published is not an earlier run.
	if l.adopt(proto.Clone(current).(*meshv1.NodeRecord)) {
		t.Fatal("adopted an echo of the current record")
	}
	// Same version, other content: a record from an earlier run.
	if !l.adopt(&meshv1.NodeRecord{NodeId: "me", Epoch: 100, Seq: 2, UpdatedUnixMs: 1}) {
		t.Fatal("did not adopt a same-version record from an earlier life")
	}
	if !l.adopt(&meshv1.NodeRecord{NodeId: "me", Epoch: 200, Seq: 7}) {
		t.Fatal("did not adopt a newer version from an earlier life")
	}
	if r := l.next(); r.GetEpoch() != 200 || r.GetSeq() != 8 {
		t.Fatalf("next record is (%d,%d), want (200,8)", r.GetEpoch(), r.GetSeq())
	}
}

func TestLocalStateLatencyAverage(t *testing.T) {
	l := newLocalState("me", 1, 0.5, time.Now)
	l.setModels([]string{"m"}, nil)
	l.observe("m", 10*time.Millisecond)
	l.observe("m", 20*time.Millisecond)
	l.observe("m", 20*time.Millisecond)
	r := l.next()
	if got := r.GetModels()[0].GetLatencyUs(); got != 17500 {
		t.Fatalf("latency average = %dus, want 17500", got)
	}
	if l.setModels([]string{"m"}, nil) {
		t.Fatal("an unchanged model set reported a change")
	}
	if !l.setModels(nil, []string{"m"}) {
		t.Fatal("a model warming up is a change")
	}
}

func TestLogBridgeLevels(t *testing.T) {
	var buf bytes.Buffer
	l := newStdLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Printf("[WARN] memberlist: Refuting a suspect message (from: x)")
	l.Printf("[ERR] memberlist: Failed to send ping")
	l.Printf("[DEBUG] memberlist: Stream connection")
	l.Printf("plain line")
	out := buf.String()
	for _, want := range []string{
		`level=WARN msg="Refuting a suspect message (from: x)"`,
		`level=ERROR msg="Failed to send ping"`,
		`level=DEBUG msg="Stream connection"`,
		`level=INFO msg="plain line"`,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("log output lacks %q:\n%s", want, out)
		}
	}
}

func TestConfigParsing(t *testing.T) {
	for _, good := range []string{"MDEyMzQ1Njc4OWFiY2RlZg==", "MDEyMzQ1Njc4OWFiY2RlZg"} {
		if k, err := ParseKey(good); err != nil || string(k) != "0123456789abcdef" {
			t.Fatalf("ParseKey(%q) = %q, %v", good, k, err)
		}
	}
	for _, bad := range []string{"not base64!", "c2hvcnQ="} {
		if _, err := ParseKey(bad); err == nil {
			t.Fatalf("ParseKey(%q) accepted", bad)
		}
	}
	cases := map[string]struct {
		host string
		port int
	}{
		"127.0.0.1:0": {"127.0.0.1", 0}, "10.1.2.3": {"10.1.2.3", 7946}, ":8000": {"0.0.0.0", 8000}, "[::1]:9": {"::1", 9},
	}
	for in, want := range cases {
		h, p, err := splitHostPort(in, DefaultGossipPort)
		if err != nil || h != want.host || p != want.port {
			t.Fatalf("splitHostPort(%q) = %q %d %v", in, h, p, err)
		}
	}
	if _, err := (Config{}).withDefaults(); err == nil {
		t.Fatal("a config without a node id was accepted")
	}
	if _, err := (Config{NodeID: "x", EncryptionKey: []byte("short")}).withDefaults(); err == nil {
		t.Fatal("a bad key length was accepted")
	}
	c, err := (Config{NodeID: "x"}).withDefaults()
	if err != nil || c.BindAddr != "0.0.0.0:7946" || c.Timers != LANTimers() {
		t.Fatalf("defaults: %+v %v", c, err)
	}
}
