package dispatch_test

import (
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// attempt is one request of a closed-loop client: when it was sent, when
// its answer arrived, and the status.
type attempt struct {
	sent, answered time.Duration
	status         int
}

// 65 closed-loop clients through a forwarding node against a holder whose
// cap is 64: only the excess is refused. Every 503 must have been answered
// while 64 other requests were in flight (each of them later answered 200:
// the refusal happened at an instant that 64 successful requests' client
// intervals all contain, since each client interval contains the holder's
// serving interval), the holder's engine never runs more than 64 at once,
// and every client finishes its share.
func TestClosedLoopOverTheCapRefusesOnlyTheExcess(t *testing.T) {
	var inside, peak atomic.Int64
	c := capCluster(t, func(n *tnode) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			v := inside.Add(1)
			for {
				p := peak.Load()
				if v <= p || peak.CompareAndSwap(p, v) {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
			inside.Add(-1)
			w.Write([]byte("ok"))
		})
	})
	const clients, each = 65, 20
	t0 := time.Now()
	var mu sync.Mutex
	var log []attempt
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []attempt
			for ok := 0; ok < each; {
				s := time.Since(t0)
				resp, _ := c.send(t, "n1", "m", "", "x")
				a := attempt{sent: s, answered: time.Since(t0), status: resp.StatusCode}
				mine = append(mine, a)
				switch a.status {
				case 200:
					ok++
				case 503:
					if resp.Header.Get("Retry-After") == "" {
						t.Errorf("503 without Retry-After")
					}
					// A client that honours the refusal backs off a
					// little instead of spinning.
					time.Sleep(time.Millisecond)
				default:
					t.Errorf("status %d", a.status)
					return
				}
			}
			mu.Lock()
			log = append(log, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var starts, ends []time.Duration
	var refused []attempt
	for _, a := range log {
		if a.status == 200 {
			starts, ends = append(starts, a.sent), append(ends, a.answered)
		} else {
			refused = append(refused, a)
		}
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
	// covering counts the successful requests in flight at instant x.
	covering := func(x time.Duration) int {
		begun := sort.Search(len(starts), func(i int) bool { return starts[i] > x })
		over := sort.Search(len(ends), func(i int) bool { return ends[i] >= x })
		return begun - over
	}
	worst, bad := clients, 0
	for _, a := range refused {
		best := covering(a.sent)
		for i := sort.Search(len(starts), func(i int) bool { return starts[i] >= a.sent }); i < len(starts) && starts[i] <= a.answered; i++ {
			best = max(best, covering(starts[i]))
		}
		worst = min(worst, best)
		if best < 64 {
			if bad++; bad > 5 {
				continue
			}
			t.Errorf("a 503 (sent %v, answered %v) while at most %d successful requests were in flight; the cap is 64", a.sent, a.answered, best)
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d 503s came with fewer than 64 requests in flight", bad, len(refused))
	}
	t.Logf("%d clients x %d successes: %d 503s (fewest successful requests in flight at a refusal: %d), engine peak %d", clients, each, len(refused), worst, peak.Load())
	if p := peak.Load(); p > 64 {
		t.Fatalf("the holder's engine ran %d requests at once over a cap of 64", p)
	}
	if len(starts) != clients*each {
		t.Fatalf("%d successes, want %d", len(starts), clients*each)
	}
}
