package limits

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
)

// TestUsageIsBatched: 1000 requests from 8 goroutines become a handful of
// raft entries (one per 256 requests, plus the final flush), with exact
// totals.
func TestUsageIsBatched(t *testing.T) {
	c := cluster(t, 1, nil)
	p := c.Peer("n1")
	keys := []string{"key_u1", "key_u2"}
	for _, k := range keys {
		createKey(t, c, k, consensus.Limits{})
	}
	l, reg := newLimiter(t, p, Config{FlushInterval: time.Hour}, nil)
	before := applies(p)
	const workers, each = 8, 125
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			caller := createCaller(keys[w%2])
			for i := 0; i < each; i++ {
				tk, d := l.Admit(context.Background(), chat(caller))
				if d != nil {
					t.Errorf("admit: %v", d)
					return
				}
				status := 200
				if i%25 == 0 {
					status = 500
				}
				tk.Done(Usage{PromptTokens: 10, CompletionTokens: 2, Status: status})
			}
		}()
	}
	wg.Wait()
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	entries := applies(p) - before
	batches := counter(reg, "infermesh_limits_usage_batches_total", map[string]string{"result": "ok"})
	const total = workers * each
	if entries < 1 || entries > total/DefaultFlushEntries+1 || float64(entries) != batches {
		t.Fatalf("%d raft entries and %v batches for %d requests, want at most %d", entries, batches, total, total/DefaultFlushEntries+1)
	}
	rows := p.Node.State().Usage(consensus.ByApp)
	var req, in, out, errs int64
	for _, r := range rows {
		req += r.Requests
		in += r.InputTokens
		out += r.OutputTokens
		errs += r.Errors
	}
	if req != total || in != 10*total || out != 2*total || errs != workers*each/25 {
		t.Fatalf("usage totals %+v, want %d requests, %d/%d tokens, %d errors", rows, total, 10*total, 2*total, workers*each/25)
	}
	if len(rows) != 2 || rows[0].Group != "app-key_u1" || rows[0].Requests != total/2 {
		t.Fatalf("usage by app = %+v", rows)
	}
}

// TestUsageFlushesOnItsOwn: without Flush, the periodic flusher sends it.
func TestUsageFlushesOnItsOwn(t *testing.T) {
	c := cluster(t, 1, nil)
	p := c.Peer("n1")
	createKey(t, c, "key_f", consensus.Limits{})
	l, _ := newLimiter(t, p, Config{FlushInterval: 20 * time.Millisecond}, nil)
	for i := 0; i < 3; i++ {
		if d := admit(l, chat(createCaller("key_f"))); d != nil {
			t.Fatal(d)
		}
	}
	c.WaitFor("usage to reach raft", func() bool {
		rows := p.Node.State().Usage(consensus.ByKey)
		return len(rows) == 1 && rows[0].Requests == 3
	})
}

// TestUsageSequenceContinuesAfterRestart: a new limiter on the same node
// (a restart) sends batches consensus does not mistake for duplicates.
func TestUsageSequenceContinuesAfterRestart(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	p := c.Peer("n1")
	createKey(t, c, "key_s", consensus.Limits{})
	for run := 0; run < 2; run++ {
		l, _ := newLimiter(t, p, Config{FlushInterval: time.Hour}, clk.Now)
		admit(l, chat(createCaller("key_s")))
		if err := l.Flush(context.Background()); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		l.Close()
		clk.Advance(time.Second) // the node was down for a while
	}
	rows := p.Node.State().Usage(consensus.ByKey)
	if len(rows) != 1 || rows[0].Requests != 2 {
		t.Fatalf("usage = %+v, want both runs' requests", rows)
	}
}
