package prefix

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/mesh/route"
)

func TestTrackerLRUBounds(t *testing.T) {
	tr := NewTracker(TrackerConfig{Capacity: 3})
	tr.Record(1, 2, 3)
	if got := tr.Recent(10); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Fatalf("recent = %v", got)
	}
	tr.Record(1) // touch: 2 is now the least recent
	tr.Record(4)
	if tr.Contains(2) || !tr.Contains(1) || !tr.Contains(3) || !tr.Contains(4) || tr.Len() != 3 {
		t.Fatalf("after evicting: recent = %v", tr.Recent(10))
	}
	if got := tr.Recent(2); !slices.Equal(got, []uint64{4, 1}) {
		t.Fatalf("recent(2) = %v", got)
	}
	if k := tr.Longest([]uint64{9, 3, 8}); k != 2 {
		t.Fatalf("longest = %d, want 2", k)
	}
	if k := tr.Longest([]uint64{9, 2}); k != 0 {
		t.Fatalf("longest of forgotten = %d, want 0", k)
	}

	// Many more records than the capacity keep it exactly bounded and keep
	// the newest ones.
	big := NewTracker(TrackerConfig{})
	for i := uint64(0); i < 3*DefaultCapacity; i++ {
		big.Record(i)
		if big.Len() > DefaultCapacity {
			t.Fatalf("len %d after %d records", big.Len(), i+1)
		}
	}
	if big.Len() != DefaultCapacity || !big.Contains(3*DefaultCapacity-1) || big.Contains(2*DefaultCapacity-1) || !big.Contains(2*DefaultCapacity) {
		t.Fatalf("len %d, wrong entries kept", big.Len())
	}
	r := big.Recent(DefaultCapacity + 5)
	if len(r) != DefaultCapacity || r[0] != 3*DefaultCapacity-1 || r[len(r)-1] != 2*DefaultCapacity {
		t.Fatalf("recent: %d entries, %d..%d", len(r), r[0], r[len(r)-1])
	}
}

func TestTrackerCapacityOne(t *testing.T) {
	tr := NewTracker(TrackerConfig{Capacity: 1})
	tr.Record(1, 2, 2, 3)
	if tr.Len() != 1 || !tr.Contains(3) || !slices.Equal(tr.Recent(5), []uint64{3}) {
		t.Fatalf("recent = %v", tr.Recent(5))
	}
}

func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(TrackerConfig{Capacity: 64})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < 5000; i++ {
				tr.Record(r.Uint64N(200))
				tr.Contains(r.Uint64N(200))
				if i%100 == 0 {
					tr.Digest()
				}
			}
		}()
	}
	wg.Wait()
	if tr.Len() != 64 || len(tr.Recent(100)) != 64 {
		t.Fatalf("len %d recent %d", tr.Len(), len(tr.Recent(100)))
	}
}

func TestDigestHoldsRecentAndFewFalsePositives(t *testing.T) {
	tr := NewTracker(TrackerConfig{})
	r := rand.New(rand.NewPCG(7, 7))
	var added []uint64
	for i := 0; i < 1000; i++ {
		h := r.Uint64()
		added = append(added, h)
		tr.Record(h)
	}
	d := tr.Digest()
	if len(d.Bits) != DefaultDigestBytes || d.Entries != DefaultDigestEntries || d.Hashes != 11 {
		t.Fatalf("digest: %d bytes, %d entries, %d hashes", len(d.Bits), d.Entries, d.Hashes)
	}
	// Every one of the most recent entries is held: no false negatives.
	for _, h := range added[len(added)-DefaultDigestEntries:] {
		if !d.Contains(h) {
			t.Fatalf("recent hash %x missing from the digest", h)
		}
	}
	// False positives: measured over a million hashes never added
	// (including the older, forgotten ones), against the estimate.
	const probes = 1_000_000
	fp := 0
	for i := 0; i < probes; i++ {
		if d.Contains(r.Uint64()) {
			fp++
		}
	}
	rate, want := float64(fp)/probes, d.FalsePositiveRate()
	t.Logf("digest %d bytes, %d entries, k=%d: false positives %.5f%% (estimate %.5f%%)", len(d.Bits), d.Entries, d.Hashes, 100*rate, 100*want)
	if want > 0.001 || rate > 1.5*want+0.00005 {
		t.Fatalf("false-positive rate %.5f, estimate %.5f", rate, want)
	}
	// A request with a 20-message history looks up 20 prefixes per peer.
	if per := 1 - pow(1-rate, 20); per > 0.02 {
		t.Fatalf("per-request false match %.4f", per)
	}
	if NewTracker(TrackerConfig{}).Digest().Valid() != true || !NewTracker(TrackerConfig{}).Digest().Empty() {
		t.Fatal("an empty tracker's digest must be the empty digest")
	}
}

func pow(x float64, n int) float64 {
	out := 1.0
	for i := 0; i < n; i++ {
		out *= x
	}
	return out
}

func TestDigestSizeBound(t *testing.T) {
	tr := NewTracker(TrackerConfig{DigestBytes: 1 << 20, DigestEntries: 10})
	tr.Record(1, 2, 3)
	if d := tr.Digest(); len(d.Bits) != route.MaxDigestBytes || d.Entries != 3 || !d.Valid() {
		t.Fatalf("digest %d bytes, %d entries", len(d.Bits), d.Entries)
	}
}
