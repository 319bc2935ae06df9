package onnx

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// recordingBatcher builds a batcher over the real model that records the
// size of every session run. maxWait is an hour, so a worker only holds a
// batch back while a call is still arriving (tests hold calls in prepare to
// control that): nothing these tests check depends on timing.
func recordingBatcher(t *testing.T, maxBatch int) (*batcher, *embedder, func() []int) {
	t.Helper()
	e := loadTinyBERT(t, testRuntime(t, Config{MaxBatch: 1}), genTinyBERT(t), nil)
	var mu sync.Mutex
	var sizes []int
	b := newBatcher(maxBatch, time.Hour, 1, func(seqs []sequence) ([][]float32, error) {
		mu.Lock()
		sizes = append(sizes, len(seqs))
		mu.Unlock()
		return e.infer(seqs)
	})
	t.Cleanup(b.close)
	return b, e, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sizes)
	}
}

func seqsOf(t *testing.T, e *embedder, texts ...string) []sequence {
	t.Helper()
	s, err := e.sequences(engine.EmbedRequest{Texts: texts})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ready returns a prepare function that returns seqs.
func ready(seqs []sequence) func() ([]sequence, error) {
	return func() ([]sequence, error) { return seqs, nil }
}

// held returns a prepare function that announces itself on entered and
// returns seqs once release is closed.
func held(seqs []sequence, entered *sync.WaitGroup, release <-chan struct{}) func() ([]sequence, error) {
	entered.Add(1)
	return func() ([]sequence, error) {
		entered.Done()
		<-release
		return seqs, nil
	}
}

func TestBatcherMergesConcurrentCalls(t *testing.T) {
	b, e, sizes := recordingBatcher(t, 4)
	texts := []string{"one happy dog", "two", "three tired people watch", "four"}
	var entered sync.WaitGroup
	release := make(chan struct{})
	var wg sync.WaitGroup
	got := make([][]float32, len(texts))
	for i, s := range texts {
		prepare := held(seqsOf(t, e, s), &entered, release)
		wg.Go(func() {
			v, err := b.embed(context.Background(), prepare)
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = v[0]
		})
	}
	entered.Wait() // all four are arriving, so the first queued waits for the rest
	close(release)
	wg.Wait()
	// All four fit one batch, and their lengths are too close to be worth
	// a run of their own.
	if s := sizes(); len(s) != 1 || s[0] != 4 {
		t.Fatalf("run sizes %v, want one run of 4", s)
	}
	for i, s := range texts {
		want, err := e.infer(seqsOf(t, e, s))
		if err != nil {
			t.Fatal(err)
		}
		if d := vecDiff(got[i], want[0]); d > 1e-5 {
			t.Fatalf("call %d got a vector %g away from its own", i, d)
		}
	}
}

func TestBatcherDoesNotHoldLoneCalls(t *testing.T) {
	b, e, sizes := recordingBatcher(t, 4)
	// Ten inputs go as 4 + 4 + 2: with nothing else arriving, the last two
	// do not wait for the hour-long maxWait.
	v, err := b.embed(context.Background(), ready(seqsOf(t, e, testTexts(10, 0)...)))
	if err != nil || len(v) != 10 {
		t.Fatalf("%d vectors for 10 inputs, err %v", len(v), err)
	}
	v, err = b.embed(context.Background(), ready(seqsOf(t, e, "alone")))
	if err != nil || len(v) != 1 {
		t.Fatalf("%d vectors for 1 input, err %v", len(v), err)
	}
	if s := sizes(); !slices.Equal(s, []int{4, 4, 2, 1}) {
		t.Fatalf("run sizes %v, want [4 4 2 1]", s)
	}
}

// queueOne starts a call that stays queued because another call is held
// arriving; it returns the held call's release and both calls' results.
func queueOne(t *testing.T, b *batcher, ctx context.Context, queued, later []sequence) (release func(), queuedErr, laterErr <-chan error) {
	t.Helper()
	var entered sync.WaitGroup
	rel := make(chan struct{})
	q, l := make(chan error, 1), make(chan error, 1)
	prepare := held(later, &entered, rel)
	go func() {
		_, err := b.embed(context.Background(), prepare)
		l <- err
	}()
	entered.Wait()
	go func() {
		_, err := b.embed(ctx, ready(queued))
		q <- err
	}()
	for { // wait until it is queued
		b.mu.Lock()
		n := len(b.queue)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return func() { close(rel) }, q, l
}

func TestBatcherDropsCancelledCalls(t *testing.T) {
	b, e, sizes := recordingBatcher(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	release, cancelled, later := queueOne(t, b, ctx, seqsOf(t, e, "cancelled call"), seqsOf(t, e, "a", "b", "c"))
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call returned %v", err)
	}
	release() // three inputs fill a batch; the cancelled one must not be in it
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	if s := sizes(); len(s) != 1 || s[0] != 3 {
		t.Fatalf("run sizes %v, want one run of 3", s)
	}
}

func TestBatcherCloseFailsQueuedCalls(t *testing.T) {
	b, e, sizes := recordingBatcher(t, 8)
	release, queued, later := queueOne(t, b, context.Background(), seqsOf(t, e, "never run"), seqsOf(t, e, "too late"))
	b.close() // returns only after the worker goroutines have exited
	if err := <-queued; !errors.Is(err, errEngineClosed) {
		t.Fatalf("queued call returned %v after close", err)
	}
	release()
	if err := <-later; !errors.Is(err, errEngineClosed) {
		t.Fatalf("call arriving during close returned %v", err)
	}
	if _, err := b.embed(context.Background(), ready(seqsOf(t, e, "after"))); !errors.Is(err, errEngineClosed) {
		t.Fatalf("embed after close returned %v", err)
	}
	if s := sizes(); len(s) != 0 {
		t.Fatalf("runs after close: %v", s)
	}
}

func TestBatcherPrepareErrorIsReturned(t *testing.T) {
	b, _, sizes := recordingBatcher(t, 4)
	want := errors.New("bad input")
	if _, err := b.embed(context.Background(), func() ([]sequence, error) { return nil, want }); err != want {
		t.Fatalf("err = %v, want %v", err, want)
	}
	b.mu.Lock()
	arriving := b.arriving
	b.mu.Unlock()
	if arriving != 0 || len(sizes()) != 0 {
		t.Fatalf("after a failed prepare: arriving %d, runs %v", arriving, sizes())
	}
}

func TestPartition(t *testing.T) {
	for _, c := range []struct {
		lens     []int
		overhead int
		want     []int
	}{
		{[]int{10}, 64, []int{1}},
		{[]int{10, 10, 10, 10}, 64, []int{4}},
		// One long input on its own saves 4*(200-5) padded tokens.
		{[]int{5, 5, 5, 5, 200}, 64, []int{4, 5}},
		// Padding three rows from 5 to 20 (45 tokens) is cheaper than a run (64).
		{[]int{5, 5, 5, 20}, 64, []int{4}},
		// From 5 to 30 (75 tokens) it is not.
		{[]int{5, 5, 5, 30}, 64, []int{3, 4}},
		{[]int{1, 2, 3}, 0, []int{1, 2, 3}},
		{nil, 64, nil},
	} {
		if got := partition(c.lens, c.overhead); !slices.Equal(got, c.want) {
			t.Errorf("partition(%v, %d) = %v, want %v", c.lens, c.overhead, got, c.want)
		}
	}
}
