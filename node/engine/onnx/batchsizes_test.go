package onnx

import (
	"context"
	"slices"
	"sync"
	"testing"
)

// TestBatchSizesCountTakenBatches merges 5 held single-input calls into a
// batcher of at most 4 rows and checks the size histogram it reports: one
// batch of 4 and one of 1, with cumulative buckets 1, 2, 4.
func TestBatchSizesCountTakenBatches(t *testing.T) {
	b, e, _ := recordingBatcher(t, 4)
	var entered sync.WaitGroup
	release := make(chan struct{})
	var done sync.WaitGroup
	for range 5 {
		prepare := held(seqsOf(t, e, "a few words of input"), &entered, release)
		done.Go(func() {
			if _, err := b.embed(context.Background(), prepare); err != nil {
				t.Error(err)
			}
		})
	}
	entered.Wait()
	close(release)
	done.Wait()
	s := b.batchSizes()
	if s.Count != 2 || s.Sum != 5 || s.Queued != 0 {
		t.Fatalf("count %d sum %d queued %d, want 2 batches of 5 rows, none queued", s.Count, s.Sum, s.Queued)
	}
	if !slices.Equal(s.Bounds, []float64{1, 2, 4}) || !slices.Equal(s.Cumulative, []uint64{1, 1, 2}) {
		t.Fatalf("bounds %v cumulative %v, want [1 2 4] [1 1 2]", s.Bounds, s.Cumulative)
	}
}
