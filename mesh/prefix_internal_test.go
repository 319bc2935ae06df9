package mesh

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

func TestDigestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = r.Uint64()
	}
	d := route.NewPrefixDigest(512, hashes)
	l := newLocalState("n1", 1, 0.5, time.Now)
	l.setPrefix(d)
	if !l.loadCh.Load() {
		t.Fatal("a new digest does not mark the record changed")
	}
	rec := l.next()
	l.setPrefix(d)
	if l.loadCh.Load() {
		t.Fatal("the same digest marks the record changed")
	}
	got := viewOf(rec).Prefixes
	if got.Hashes != d.Hashes || got.Entries != 256 || string(got.Bits) != string(d.Bits) {
		t.Fatalf("round trip: %d hashes %d entries", got.Hashes, got.Entries)
	}
	for _, h := range hashes {
		if !got.Contains(h) {
			t.Fatalf("decoded digest misses %x", h)
		}
	}
	// No digest, no field: records of nodes that served no chat stay small.
	if r := newLocalState("n2", 1, 0.5, time.Now).next(); r.PrefixDigest != nil {
		t.Fatal("an empty digest is encoded")
	}
}

func TestDigestFromProtoRejectsMalformed(t *testing.T) {
	ones := make([]byte, 64)
	for i := range ones {
		ones[i] = 0xff
	}
	for _, p := range []*meshv1.PrefixDigest{
		nil,
		{Bloom: ones}, // no hash functions
		{Bloom: ones, HashCount: route.MaxDigestHashes + 1}, // too many
		{Bloom: make([]byte, route.MaxDigestBytes+1), HashCount: 3},
		{HashCount: 3},
	} {
		if d := digestFromProto(p); !d.Empty() || d.Contains(42) {
			t.Fatalf("malformed digest %v accepted", p)
		}
	}
}

// TestRecordWithDigestFitsGossipPacket checks the byte budget: a ready
// node with a full default digest and a few models still sends its record
// through UDP gossip rather than a TCP send to every member.
func TestRecordWithDigestFitsGossipPacket(t *testing.T) {
	cfg, err := Config{NodeID: "node-a1b2c3"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	mc, err := cfg.memberlistConfig()
	if err != nil {
		t.Fatal(err)
	}
	maxCast := mc.UDPBufferSize - 256 // as New computes it
	r := rand.New(rand.NewPCG(3, 4))
	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = r.Uint64()
	}
	l := newLocalState(cfg.NodeID, uint64(time.Now().UnixNano()), 0.5, time.Now)
	l.setHealth(route.HealthReady)
	var ids []string
	info := map[string]ModelInfo{}
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("onnx/family%d/variant-%d", i, i)
		ids = append(ids, id)
		info[id] = ModelInfo{WireID: fmt.Sprintf("family%d:variant-%d", i, i), Task: "chat", Created: time.Now().Unix(), SizeBytes: 1 << 30}
		l.observe(id, 123*time.Millisecond)
	}
	l.setModels(nil, ids)
	l.setInfo(info)
	l.setRouting(Routing{MaxInFlight: 64, Weight: 3})
	l.setInFlight(17)
	l.setPrefix(route.NewPrefixDigest(512, hashes))
	size := len(encodeRecord(l.next()))
	t.Logf("record with 3 models and a 512-byte digest: %d bytes; UDP gossip limit %d", size, maxCast)
	if size > maxCast {
		t.Fatalf("record is %d bytes, over the %d-byte gossip packet budget", size, maxCast)
	}
}
